"""``zoo bench dp --forms`` (zoo.bench.dp_forms): the per-site table of ghost clipping's norm
forms, alone or measured before the bench's rows."""

import pytest

from zoo.bench.dp import bench_dp
from zoo.dp.ghost import forms
from zoo.errors import ZooError


def test_forms_only_lists_every_dense_site_at_the_rules_shape():
    result = bench_dp("transformer-xs", batch=4, seq=64, microbatch=2, forms="formula", forms_only=True)
    rows = result["forms"]["rows"]
    assert "rows" not in result  # nothing timed
    sites = {r["site"] for r in rows}
    assert {"head", "blocks.attn.q", "blocks.mlp.down"} <= sites
    assert all(r["shape"]["batch"] == 2 and r["shape"]["seq"] == 64 for r in rows)  # the microbatch
    assert {r["layers"] for r in rows if r["site"].startswith("blocks.")} == {2}


def test_measured_forms_are_cached_and_shown(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path))
    result = bench_dp("transformer-xs", batch=2, seq=32, forms="measure", forms_only=True)
    table = result["forms"]
    assert table["timed"] and all(set(r["ms"]) == set(forms.FORMS) for r in table["rows"])
    for r in table["rows"]:
        assert r["chosen"] == min(r["ms"], key=r["ms"].get)
        assert forms.measured(forms.Shape(**r["shape"]))["form"] == r["chosen"]


def test_a_bad_forms_mode_names_the_valid_ones():
    with pytest.raises(ZooError, match="formula, measure"):
        bench_dp("transformer-xs", batch=2, seq=32, forms="fastest", forms_only=True)


def test_the_bookkeeping_row_runs_under_a_remat_policy():
    """``ghost bookkeeping`` (zoo.bench.dp_rows): book-keeping where the ghost row would take the
    second backward; opt-in, so the default rows (and their CPU figures) are unchanged."""
    from zoo.bench.dp_rows import default_methods

    assert "ghost bookkeeping" not in default_methods()
    result = bench_dp(
        "transformer-xs",
        batch=2,
        seq=16,
        methods=["ghost bookkeeping"],
        remat="full",
        rounds=1,
        steps_per_round=1,
        memory_sweep=False,
    )
    assert [r["method"] for r in result["rows"]] == ["non-private", "ghost bookkeeping"]
