"""Issue 33: ``zoo bench scale`` with a mesh over fewer devices than there are names the device
count and the batch together, in one line (needs 8 simulated devices)."""

from tests.e2e.clikit import refused


def test_a_mesh_on_some_of_the_devices_names_the_devices_and_the_batch(capsys):
    line = refused(capsys, ["bench", "scale", "mlp-s", "--mesh", "data=3;data=8"], "mesh data=3")
    assert "3 of the 8 devices" in line and "--batch 16 is not a multiple of 3" in line
    assert "--batch 48" in line
