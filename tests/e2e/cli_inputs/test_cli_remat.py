"""``--remat`` on a model with no scanned stack (the CNN): a warning says the policy changes
nothing, and ``--remat auto`` times one program and picks none."""

from __future__ import annotations

from zoo.cli import main


def test_remat_on_the_cnn_says_it_does_nothing_and_auto_sees_one_program(capsys, tmp_path, monkeypatch):
    """Issue 41, item 20: every policy is the same program on the CNN (no stack); --remat auto timed ten
    of them and picked one on noise. Now a warning says so, and auto times one and picks none."""
    import json
    import struct

    import numpy as np

    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(1)
    data = tmp_path / "idx"
    data.mkdir()
    for split, n in (("train", 64), ("t10k", 16)):
        for kind, array in (
            ("images-idx3", rng.integers(0, 256, (n, 8, 8), dtype=np.uint8)),
            ("labels-idx1", (np.arange(n) % 10).astype(np.uint8)),
        ):
            head = struct.pack(">BBBB", 0, 0, 8, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
            (data / f"{split}-{kind}-ubyte").write_bytes(head + array.tobytes())
    small = {"conv1_kernel": 3, "conv1_stride": 1, "conv1_padding": 1, "conv2_kernel": 3, "conv1_features": 3}
    sets = [f"--set=model.{key}={value}" for key, value in small.items()]
    argv = ["train", "mnist-cnn", "--dataset", f"idx:{data}", "--steps=1", "--no-progress", "--json", *sets]
    assert main([*argv, "--remat", "full", "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "train.remat='full' has no effect on this cnn model" in err
    assert main([*argv, "--remat", "auto", "--memory-budget", "1GB", "--out", str(tmp_path / "b")]) == 0
    captured = capsys.readouterr()
    assert "train.remat='auto' has no effect" in captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["remat"] == "auto:none"
    assert captured.err.count("(= none)") >= 5  # the other policies: the same program as none
