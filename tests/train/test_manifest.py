"""zoo.train.manifest: a step is intact when its manifest is there and every file matches it;
``hashes=False`` checks that every file is there at its size, and reads no checksum."""

from __future__ import annotations

import sys

from zoo.train import manifest


def saved(run, step: int, files: dict[str, bytes]) -> None:
    where = manifest.step_dir(run, step)
    for rel, data in files.items():
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        (where / rel).write_bytes(data)
    manifest.write_manifest(where)


def test_intact_steps_and_what_is_wrong_with_the_others(tmp_path):
    saved(tmp_path, 2, {"a.bin": b"abc", "d/b.bin": b"xyz" * 100})
    saved(tmp_path, 4, {"a.bin": b"abd", "d/b.bin": b"xyz" * 100})
    assert manifest.saved_steps(tmp_path) == [2, 4]
    assert manifest.latest_step(tmp_path) == 4 and manifest.step_problem(tmp_path, 4) is None
    # one byte flipped, same size: the checksum finds it, the sizes alone do not
    (manifest.step_dir(tmp_path, 4) / "a.bin").write_bytes(b"abX")
    assert manifest.step_problem(tmp_path, 4) == "a.bin does not match its checksum"
    assert manifest.step_problem(tmp_path, 4, hashes=False) is None
    assert manifest.latest_step(tmp_path) == 2 and manifest.latest_step(tmp_path, hashes=False) == 4
    # cut short, or gone: both checks find it
    (manifest.step_dir(tmp_path, 4) / "d" / "b.bin").write_bytes(b"xyz")
    assert manifest.step_problem(tmp_path, 4, hashes=False) == "d/b.bin has 3 bytes, its manifest says 300"
    (manifest.step_dir(tmp_path, 4) / "d" / "b.bin").unlink()
    assert manifest.step_problem(tmp_path, 4, hashes=False) == "d/b.bin is missing"
    (manifest.step_dir(tmp_path, 2) / manifest.MANIFEST).unlink()
    assert manifest.step_problem(tmp_path, 2).startswith(f"it has no {manifest.MANIFEST}")
    assert manifest.latest_step(tmp_path) is None and manifest.latest_step(tmp_path, hashes=False) is None


def test_a_manifest_that_names_a_file_outside_its_step_is_unreadable(tmp_path):
    saved(tmp_path, 1, {"a.bin": b"abc"})
    path = manifest.step_dir(tmp_path, 1) / manifest.MANIFEST
    path.write_text(path.read_text().replace('"a.bin"', '"../a.bin"'))
    assert manifest.step_problem(tmp_path, 1) == f"its {manifest.MANIFEST} is unreadable"


def test_it_does_not_import_orbax():
    """``zoo runs`` reads manifests of runs without loading the checkpoint library."""
    import subprocess

    code = "import sys, zoo.train.manifest, zoo.commands.runs; print('orbax' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]
