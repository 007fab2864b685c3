"""The per-layer norm form (zoo.dp.ghost.forms and zoo.dp.ghost.measure): the formula, the
measured choice read from the cache, and ghost clipping with a different form at different
sites against the vmap path, per record and per user, for the transformer, Llama, the MLP, the
CNN, a tied head and LoRA, under remat and bf16."""

import warnings

import jax
import numpy as np
import pytest

import zoo
from tests.conftest import fast_jit, reduction_size
from tests.dp.ghost import test_units as units_test
from tests.dp.ghost.test_api import KINDS, ONES, assert_close, batch, params_of, vmap_fn
from tests.dp.ghost.test_rules import TIED
from tests.numerics import assert_close_bf16
from zoo.dp import ClipRequest, ghost
from zoo.dp.ghost import forms, measure, stages


@pytest.mark.parametrize(
    "seq, d_in, d_out, sums, form",
    [
        (16, 32, 32, True, "gram"),  # too few positions either way
        (32, 768, 768, True, "materialise"),  # book-keeping: the Gram form pays the sum again
        (256, 768, 768, False, "gram"),  # norms alone: T^2 (d_in + d_out) < T d_in d_out
        (256, 768, 50304, True, "materialise"),  # GPT-2's tied head at T 256
        (256, 768, 50304, False, "gram"),
        (1024, 768, 3072, False, "materialise"),
    ],
)
def test_the_formula_counts_the_clipped_sum_under_book_keeping(seq, d_in, d_out, sums, form):
    assert forms.formula(seq, d_in, d_out, sums) == form
    assert ghost.dense_method(seq, d_in, d_out, sums) == form


def test_flops_of_each_form():
    assert forms.flops("materialise", 8, 3, 5, True) == 8 * 3 * 5
    assert forms.flops("gram", 8, 3, 5, False) == 8 * 8 * (3 + 5)
    assert forms.flops("gram", 8, 3, 5, True) == 8 * 8 * (3 + 5) + 8 * 3 * 5


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_a_measured_form_overrides_the_formula_for_its_shape_only(cache):
    shape = forms.Shape("dense", 8, 1024, 768, 3072, "bfloat16", True)
    other = forms.Shape("dense", 8, 1024, 768, 3072, "float32", True)
    assert forms.choose(shape) == forms.choose(other) == "materialise"  # no cache: the formula
    measure._write(forms.key(shape), {"form": "gram", "ms": {"gram": 1.0, "materialise": 2.0}})
    assert forms.choose(shape) == "gram" and forms.choose(other) == "materialise"
    assert forms.Choice("materialise", True).pick("dense", 8, 1024, 768, 3072, "bfloat16") == "materialise"


def test_measure_times_both_forms_once_and_caches_the_faster(cache):
    shape = forms.Shape("dense", 2, 8, 4, 6, "float32", True)
    found = measure.measure([shape, shape])
    entry = found[shape]
    assert set(entry["ms"]) == set(forms.FORMS) and entry["form"] == min(entry["ms"], key=entry["ms"].get)
    assert forms.measured(shape)["form"] == entry["form"]


@pytest.fixture
def used(monkeypatch):
    """The shapes whose measured form the rules read while a step was traced."""
    found = set()
    real = forms.measured

    def spy(shape):
        entry = real(shape)
        if entry is not None:
            found.add(shape)
        return entry

    monkeypatch.setattr(forms, "measured", spy)
    return found


def _mixed_cache(gp, params, x, y) -> tuple[set, set]:
    """Cache a measured form for every distinct dense shape of the plan: the formula's opposite
    for every other shape, so that the step mixes the two forms. Returns the forms and the
    shapes cached."""
    rows = measure.site_shapes(gp, params, x, y)
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    cached = set()
    for i, shape in enumerate(shapes):
        form = shape.formula() if i % 2 else next(f for f in forms.FORMS if f != shape.formula())
        measure._write(forms.key(shape), {"form": form, "ms": {}})
        cached.add(form)
    return cached, set(shapes)


def _lora(base):
    from zoo import lora
    from zoo.configs import LoraConfig

    setup = lora.resolve(base, LoraConfig(rank=3, targets=("*",)))
    cfg = lora.adapted_config(base, setup)
    return cfg, lora.freeze_plan(cfg, setup)


CASES = {  # name -> (config, freeze plan)
    "transformer": (KINDS["transformer"], None),
    "llama": (KINDS["llama"], None),
    "mlp": (KINDS["mlp"], None),
    "cnn": (KINDS["cnn"], None),
    "tied": (TIED["gpt2-like"], None),
    "lora": _lora(KINDS["llama"]),
}
MIXED = {"transformer", "llama", "tied", "lora"}  # models with two or more dense sequence shapes


def _ghost_run(cfg, plan, remat="none", precision=None, slots=None):
    def run(params, frozen, x, y, clip, mask):
        request = ClipRequest(clip, example_mask=mask)
        return ghost.ghost_clipped_grad_sum(
            cfg,
            params,
            x,
            y,
            request,
            frozen=frozen,
            freeze_plan=plan,
            remat=remat,
            precision=precision,
            slots=slots,
        )

    return fast_jit(run)  # a new program: it reads the cache when it is traced


@pytest.mark.numerics
@pytest.mark.parametrize("name", list(CASES))
def test_records_with_a_form_per_site_match_the_vmap_path(name, cache, used):
    cfg, plan = CASES[name]
    full = params_of(cfg)
    params, frozen = plan.split(full) if plan is not None else (full, None)
    x, y = batch(cfg)
    cached, shapes = _mixed_cache(stages.prepare(cfg, x, plan), full, x, y)
    if name in MIXED:
        assert cached == set(forms.FORMS)
    run = _ghost_run(cfg, plan)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        clip = np.float32(np.median(np.asarray(run(params, frozen, x, y, np.float32(np.inf), ONES)[1])))
        ours, norms, _ = run(params, frozen, x, y, clip, ONES)
    assert used == shapes  # the step read every shape's measured form
    ref, ref_norms = vmap_fn(cfg, "nnx", plan)(params, frozen, x, y, clip, ONES)
    assert_close(cfg, ours, ref, norms, ref_norms)


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["transformer", "llama", "mlp", "cnn", "tied"])
def test_users_with_a_form_per_site_match_the_vmap_user_path(name, cache, used):
    cfg = TIED["llama-tied"] if name == "tied" else CASES[name][0]
    params = params_of(cfg)
    x, y = units_test.data(cfg)
    gp = stages.prepare(cfg, x, records=units_test.K)
    cached, shapes = _mixed_cache(gp, params, x, y)
    if name in MIXED:
        assert cached == set(forms.FORMS)
    reference = units_test.vmap_users(cfg)
    unclipped = np.asarray(reference(params, x, y, np.float32(np.inf))[1])[units_test.USERS > 0]
    clip = np.float32(np.median(unclipped))
    run = _ghost_run(cfg, None, slots=units_test.SLOTS)
    ours, norms, _ = run(params, None, x, y, clip, units_test.USERS)
    assert used == shapes  # the step read every shape's measured form
    ref, ref_norms, _ = reference(params, x, y, clip)
    n = reduction_size(cfg, units_test.ROWS)
    units_test.assert_close(norms, ref_norms, n=n, what="per-user norms")
    units_test.assert_close(ours, ref, n=n, what="clipped sum")


@pytest.mark.numerics
@pytest.mark.parametrize("remat", ["full", "dots"])
def test_a_tied_head_under_remat_and_bf16_clips_without_the_vmap_fallback(cache, remat):
    """``auto`` takes the second backward under ``full`` and book-keeping under ``dots``; both
    clip a tied head (no vmap fallback), and the bf16 step (bf16 contractions, float32 products;
    the head's float32 output gradient read in bf16, as the non-private backward reads it) is
    the float32 vmap path's under the bf16 rule."""
    cfg = TIED["gpt2-like"]
    params = params_of(cfg)
    x, y = batch(cfg)
    _, shapes = _mixed_cache(stages.prepare(cfg, x, None, remat, "bfloat16"), params, x, y)
    assert {s.dtype for s in shapes} == {"bfloat16"}  # the blocks and the head: the compute dtype
    run = _ghost_run(cfg, None, remat=remat, precision="bfloat16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        clip = np.float32(np.median(np.asarray(run(params, None, x, y, np.float32(np.inf), ONES)[1])))
        ours, norms, _ = run(params, None, x, y, clip, ONES)
    ref, ref_norms = vmap_fn(cfg, "nnx")(params, None, x, y, clip, ONES)
    n = reduction_size(cfg, len(x))
    assert_close_bf16(norms, ref_norms, n=n, what="norms")
    assert_close_bf16(ours, ref, n=n, what="clipped sum")


def test_the_choice_table_totals_are_its_rows_sums():
    cfg = zoo.get_config("transformer-xs")
    x = zoo.example_batch(cfg, 4, seed=0, seq_len=64)
    gp = stages.prepare(cfg, x)
    params = jax.eval_shape(lambda: zoo.models.canonical.init_params(cfg, 0))
    table = measure.choice_table(measure.site_shapes(gp, params, x, zoo.example_labels(cfg, x)))
    rows = table["rows"]
    assert {r["site"] for r in rows} >= {"head", "blocks.attn.q", "blocks.mlp.up"}
    for name in ("gram", "materialise"):
        assert table["totals"][name][0] == pytest.approx(sum(r["gflop"][name] for r in rows))
    assert table["totals"]["chosen"][0] == pytest.approx(sum(r["gflop"][r["chosen"]] for r in rows))
    assert table["totals"]["chosen"][0] <= table["totals"]["gram"][0]


def test_a_corrupt_or_partial_cache_falls_back_to_the_formula(cache):
    """An unreadable cache costs speed, never a run: a deeply nested file (RecursionError while
    parsing) reads as empty, and an entry without both timings is not a measurement."""
    shape = forms.Shape("dense", 8, 1024, 768, 3072, "bfloat16", True)
    path = forms.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[" * 200_000)
    assert forms.read_cache() == {} and forms.choose(shape) == "materialise"
    small = forms.Shape("dense", 2, 8, 4, 6, "float32", True)
    measure._write(forms.key(small), {"form": "gram"})  # no "ms": written by hand, or cut short
    timings = measure.measure([small])  # timed again, not a KeyError
    assert forms.timed(timings[small]) and forms.timed(forms.measured(small))
    table = measure.choice_table([{"shape": small, "layers": 1}], {small: {"form": "gram"}})
    assert table["rows"][0]["ms"] is None and table["rows"][0]["chosen"] == "gram"


def test_each_platforms_balance_is_its_chips_multiply_adds_over_its_bandwidth():
    """The forms' a-priori weighing of bytes against multiply-adds is the peak table's chip:
    a TPU v5e's, and the H200 that the device tool lends for a GPU."""
    from zoo.train.throughput import CHIPS

    for platform, chip in (("tpu", "TPU v5 lite"), ("gpu", "H200")):
        bf16, _, bandwidth = CHIPS[chip]
        assert forms.BALANCE[platform] == pytest.approx(bf16 / 2 / bandwidth, rel=0.01), platform
