"""``zoo bench scale`` says what it is doing as it goes: a mesh's compile, the rounds."""

from __future__ import annotations

import zoo.bench.scale as scale
from zoo.cli import main


def test_the_bench_says_each_compile_and_round_as_it_starts():
    heard = []
    result = scale.bench_scale("mlp-s", ["data=1"], batch=4, repeats=2, steps=1, progress=heard.append)
    assert [row["mesh"] for row in result["rows"]] == ["data=1"]
    assert heard == [
        "scale bench: compiling the step and one block on mesh data=1",
        "scale bench: a warm-up step on each of 1 meshes",
        "scale bench: timing round 1/2",
        "scale bench: timing round 2/2",
    ]


def test_the_cli_prints_the_progress_on_stderr_unless_quiet(capsys, monkeypatch):
    def bench(model, meshes, *, progress, **kwargs):  # the bench itself: the test above
        if progress is not None:
            progress("scale bench: timing round 1/1")
        return {"rows": []}

    monkeypatch.setattr(scale, "bench_scale", bench)
    for quiet, lines in (([], ["scale bench: timing round 1/1"]), (["--quiet"], [])):
        assert main(["bench", "scale", "mlp-s", "--mesh", "data=1", "--json", *quiet]) == 0
        assert capsys.readouterr().err.splitlines() == lines
