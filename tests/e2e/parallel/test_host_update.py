"""zoo.parallel.host_step (placement = "update-on-host") with the two halves on two devices (8
simulated CPU devices): the
gradient on the first, the state and the update on the last, as on an accelerator and its
host. The step equals the one-program step, the state stays on the host device, and the
read-only passes (eval, --hardest, the black-box audit) read the params beside the frozen
leaves on the compute device."""

import pytest

from tests.parallel.test_host_step import check_host_step, read_only_passes
from tests.parallel.test_placement import LLAMA
from zoo.parallel import layout_for
from zoo.parallel import placement as placements


def test_the_two_halves_run_on_two_devices():
    layout = layout_for(LLAMA)
    assert placements.host_device(layout) != placements.compute_device(layout)


@pytest.mark.numerics
@pytest.mark.parametrize("dp", [False, True])
def test_the_host_update_equals_the_device_step_across_devices(dp):
    check_host_step(dp, "bfloat16")


def test_the_device_check_catches_a_state_kept_on_the_compute_device(monkeypatch):
    """Planted: the "host" is the compute device itself: the state and the update never leave
    the device the gradient is computed on."""
    monkeypatch.setattr(placements, "host_device", placements.compute_device)
    with pytest.raises(AssertionError, match="CpuDevice"):
        check_host_step()


def test_the_read_only_passes_read_a_device_copy_beside_the_frozen_leaves():
    device, host = read_only_passes("bfloat16")
    assert device == host


def test_the_read_only_check_catches_params_left_on_the_host(monkeypatch):
    """Planted: no device copy for the read-only passes (the host params meet the frozen leaves
    on the compute device in one jit)."""
    from zoo.train.engine import Engine

    monkeypatch.setattr(Engine, "eval_params", lambda self, trainable: trainable)
    with pytest.raises(ValueError, match="incompatible devices"):
        read_only_passes("bfloat16")


def test_a_blackbox_audit_with_frozen_layers_runs_with_the_update_on_the_host(tmp_path, capsys):
    from zoo.cli import main

    argv = ["audit", "digits-mlp-dp", "--placement", "update-on-host"]
    argv += ["--freeze", "in_proj", "--mode", "blackbox", "--canaries", "20", "--steps", "2"]
    assert main([*argv, "--out", str(tmp_path / "audit")]) == 0, capsys.readouterr().err[-2000:]


def test_a_mesh_with_the_update_on_the_host_is_one_line(capsys, tmp_path):
    from tests.e2e.clikit import refused

    argv = ["train", "digits-mlp", "--placement", "update-on-host", "--mesh", "data=8"]
    refused(capsys, [*argv, "--out", str(tmp_path / "r")], "runs on one device", "data=8")
