"""zoo.train.host_update with the two halves on two devices (8 simulated CPU devices): the
gradient on the first, the state and the update on the last, as on an accelerator and its
host. The step equals the one-program step, and the state stays on the host device."""

import pytest

from tests.parallel.test_offload import LLAMA
from tests.train.test_host_update import check_host_step
from zoo.parallel import layout_for
from zoo.train import host_update


def test_the_two_halves_run_on_two_devices():
    layout = layout_for(LLAMA)
    assert host_update.host_device(layout) != host_update.compute_device(layout)


@pytest.mark.numerics
@pytest.mark.parametrize("dp", [False, True])
def test_the_host_update_equals_the_device_step_across_devices(dp):
    check_host_step(dp, "bfloat16")


def test_the_device_check_catches_a_state_kept_on_the_compute_device(monkeypatch):
    """Planted: the "host" is the compute device itself: the state and the update never leave
    the device the gradient is computed on."""
    monkeypatch.setattr(host_update, "host_device", host_update.compute_device)
    with pytest.raises(AssertionError, match="CpuDevice"):
        check_host_step()
