"""The residual inspector against byte counts worked out by hand for small shapes.

Transformer: B=2, T=8, D=16, 2 heads, F=32, L=4 (float32, so 4 bytes an element).
One [B, T, D] activation is ``ACT = B*T*D*4`` bytes and the MLP hidden is ``HID = B*T*F*4``.

Why each policy keeps what it keeps (per block, then times L for the stack):

* ``full``: nothing inside the block is saved, but the block's input is the input of the
  checkpointed function, so it is kept to recompute the block in the backward pass: 1 ACT.
* ``offload-layer-input``: the same tensor, tagged ``layer_input`` and moved to pinned_host:
  0 on device, 1 ACT on host.
* ``save-attn``: q, k, v and the attention output projection, plus the block input needed
  to recompute both LayerNorms: 5 ACT.
* ``minimal``: save-attn plus ``mlp_hidden`` (the GELU's input): 5 ACT + HID. ``mlp_out`` is
  allowed but never saved: its only consumer is the residual add, whose backward pass does
  not need its operands, and the next block's input is the scan carry anyway.
* ``offload-minimal``: the same five projections on pinned_host; the block input stays on
  device (it is the checkpoint's own argument, and ``layer_input`` is not in the offload list).
* ``nested``: L=4 runs as G=2 groups of 2. The outer scan keeps the 2 group inputs; the
  backward pass replays one group and holds its 2 layer inputs: (2 + 2) ACT.
* ``recursive``: one scan level per prime factor of L, pairs of 2s merged into 4s. L=8 runs
  as 4 x 2: the outer scan keeps 4 group inputs, and replaying one group holds 2 more:
  (4 + 2) ACT = 2 log2(L) ACT; L=64 (4 x 4 x 4) holds 12, L=12 (4 x 3) holds 7.

MLP (``mlp-s`` with L=4): batch 4, hidden H=128; one activation is ``B*H*4`` bytes. ``minimal`` keeps the block
input and ``mlp_hidden`` (the activation's input); ``mlp_out`` is the next block's input.
"""

import functools
import json
import math

import pytest

import zoo
from zoo.errors import ZooError
from zoo.remat import get_policy, policy_names
from zoo.residuals import residual_report

B, T, D, F, L, V = 2, 8, 16, 32, 4, 40
ACT = B * T * D * 4
HID = B * T * F * 4
MB, MH = 4, 128  # MLP batch and hidden width (mlp-s)
MACT = MB * MH * 4

TRANSFORMER = zoo.get_config(
    "transformer-xs", num_layers=L, d_model=D, num_heads=2, d_ff=F, max_len=T, vocab_size=V
)
# the preset plus --layers, so the CLI test below reaches the same (cached) model template
MLP = zoo.get_config("mlp-s", num_layers=L)
MODELS = {"transformer": (TRANSFORMER, B), "mlp": (MLP, MB)}


@functools.cache
def report(kind, policy, backend="nnx"):
    cfg, batch = MODELS[kind]
    return residual_report(cfg, policy, backend=backend, batch=batch)


def rows(rep, scope="stack"):
    """{name: (bytes, memory_kind, count)} of the activation rows in one scope."""
    out = {}
    for r in rep["residuals"]:
        if r["kind"] == "activation" and r["scope"] == scope:
            assert r["name"] not in out, f"two {r['name']} rows in {scope}"
            out[r["name"]] = (r["bytes"], r["memory_kind"], r["count"])
    return out


def test_full_keeps_one_block_input_per_layer():
    rep = report("transformer", "full")
    assert rows(rep) == {"layer_input": (L * ACT, "device", L)}
    assert rep["stack_device_bytes"] == L * ACT
    assert rep["total_host_bytes"] == 0


def test_full_lean_saves_exactly_what_full_saves():
    assert rows(report("transformer", "full-lean")) == rows(report("transformer", "full"))


def test_offload_layer_input_moves_the_block_inputs_to_host():
    rep = report("transformer", "offload-layer-input")
    assert rows(rep) == {"layer_input": (L * ACT, "pinned_host", L)}
    assert rep["stack_device_bytes"] == 0
    assert rep["total_host_bytes"] == L * ACT
    block = [r for r in rep["per_block"] if r["kind"] == "activation"]
    assert [(r["name"], r["memory_kind"], r["bytes"]) for r in block] == [("layer_input", "pinned_host", ACT)]


def test_save_attn():
    rep = report("transformer", "save-attn")
    named = ("layer_input", "attn_q", "attn_k", "attn_v", "attn_out")
    assert rows(rep) == {n: (L * ACT, "device", L) for n in named}
    assert rep["stack_device_bytes"] == L * 5 * ACT


def test_minimal_saves_the_projections_that_backward_needs():
    rep = report("transformer", "minimal")
    expected = {n: (L * ACT, "device", L) for n in ("layer_input", "attn_q", "attn_k", "attn_v", "attn_out")}
    expected["mlp_hidden"] = (L * HID, "device", L)
    assert rows(rep) == expected  # no mlp_out: the residual add does not need it
    assert rep["stack_device_bytes"] == L * (5 * ACT + HID)


def test_offload_minimal_splits_device_and_host():
    rep = report("transformer", "offload-minimal")
    got = rows(rep)
    assert got.pop("layer_input") == (L * ACT, "device", L)
    assert got == {
        **{n: (L * ACT, "pinned_host", L) for n in ("attn_q", "attn_k", "attn_v", "attn_out")},
        "mlp_hidden": (L * HID, "pinned_host", L),
    }
    assert rep["stack_host_bytes"] == L * (4 * ACT + HID)
    assert rep["total_host_bytes"] == rep["stack_host_bytes"]


@pytest.mark.parametrize("policy", ["full", "minimal", "offload-minimal", "nested"])
def test_bf16_stack_residuals_are_half_the_float32_ones(policy):
    """Under the bfloat16 precision policy (zoo.precision) the block activations a policy keeps
    are bf16: the same rows, half the bytes, on device and on host."""
    f32, bf16 = (
        report("transformer", policy),
        residual_report(TRANSFORMER, policy, batch=B, precision="bfloat16"),
    )
    assert bf16["precision"] == "bfloat16" and f32["precision"] == "float32"
    halved = {n: (b // 2, kind, count) for n, (b, kind, count) in rows(f32).items()}
    assert rows(bf16) == halved
    assert {r["dtype"] for r in bf16["residuals"] if r["scope"] == "stack" and r["kind"] == "activation"} == {
        "bfloat16"
    }
    for key in ("stack_device_bytes", "stack_host_bytes", "replay_device_bytes"):
        assert 2 * bf16[key] == f32[key], key


def test_nested_keeps_group_inputs_plus_one_replayed_group():
    rep = report("transformer", "nested")
    assert rep["groups"] == 2
    assert rows(rep, "stack") == {"layer_input": (2 * ACT, "device", 2)}
    assert rows(rep, "replay") == {"layer_input": (2 * ACT, "device", 2)}
    assert rep["total_device_bytes"] == 4 * ACT + rep["outside_device_bytes"]
    block = sum(r["bytes"] for r in rep["per_block"] if r["kind"] == "activation")
    assert block == ACT  # the inner layers run under ``full``


@pytest.mark.parametrize("depth, levels", [(8, [4, 2]), (64, [4, 4, 4]), (12, [4, 3]), (7, [7])])
def test_recursive_keeps_two_block_inputs_per_level(depth, levels):
    cfg = zoo.get_config(TRANSFORMER, num_layers=depth)
    rep = residual_report(cfg, "recursive", batch=B)
    assert rep["levels"] == levels and rep["groups"] is None
    assert rows(rep, "stack") == {"layer_input": (levels[0] * ACT, "device", levels[0])}
    replayed = sum(levels[1:])
    expected = {"layer_input": (replayed * ACT, "device", replayed)} if replayed else {}
    assert rows(rep, "replay") == expected
    assert rep["total_device_bytes"] == sum(levels) * ACT + rep["outside_device_bytes"]
    if depth in (8, 64):  # the figure: at most 2 log2(L) block inputs at a power of two
        assert sum(levels) <= 2 * math.log2(depth)
    nested = residual_report(cfg, "nested", batch=B)
    assert rep["total_device_bytes"] <= nested["total_device_bytes"]


def test_mlp_model():
    assert rows(report("mlp", "full")) == {"layer_input": (L * MACT, "device", L)}
    assert rows(report("mlp", "minimal")) == {
        "layer_input": (L * MACT, "device", L),
        "mlp_hidden": (L * MACT, "device", L),
    }
    rep = report("mlp", "offload-layer-input")
    assert rows(rep) == {"layer_input": (L * MACT, "pinned_host", L)}
    assert rep["total_host_bytes"] == L * MACT


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize(
    "policy", ["full", "full-lean", "save-attn", "minimal", "offload-layer-input", "offload-minimal"]
)
def test_backends_agree_on_named_residuals(kind, policy):
    nnx_rep, eqx_rep = report(kind, policy, "nnx"), report(kind, policy, "eqx")
    assert rows(nnx_rep) == rows(eqx_rep)
    for key in ("stack_device_bytes", "stack_host_bytes", "total_host_bytes"):
        assert nnx_rep[key] == eqx_rep[key]


@pytest.mark.parametrize("policy", [p for p in policy_names() if not get_policy(p).grouped])
def test_one_block_times_depth_matches_the_traced_stack(policy):
    """The per-block view (one layer on its own) and the whole-model trace (names recovered
    from inside the scan) are computed independently; they must agree on bytes."""
    rep = report("transformer", policy)
    block = sum(r["bytes"] for r in rep["per_block"] if r["kind"] == "activation")
    assert L * block == rep["stack_device_bytes"] + rep["stack_host_bytes"]


def test_outside_part_does_not_depend_on_the_checkpoint_policy():
    outside = {
        p: report("transformer", p)["outside_device_bytes"]
        for p in ("full", "minimal", "offload-layer-input")
    }
    assert len(set(outside.values())) == 1
    shapes = [r["shape"] for r in report("transformer", "full")["residuals"] if r["scope"] == "outside"]
    assert [B, T, V] in shapes  # softmax of the logits, kept for the cross-entropy backward


def test_params_are_listed_but_not_counted():
    rep = report("transformer", "full")
    params = [r for r in rep["residuals"] if r["kind"] == "param"]
    assert any(r["name"] == "param blocks.attn.q.w" for r in params)
    acts = [r for r in rep["residuals"] if r["kind"] == "activation"]
    assert rep["total_device_bytes"] == sum(r["bytes"] for r in acts if r["memory_kind"] == "device")
    assert rep["total_device_bytes"] == rep["stack_device_bytes"] + rep["outside_device_bytes"]


def test_report_is_json_with_the_documented_keys():
    rep = json.loads(json.dumps(report("transformer", "minimal")))
    for key in (
        "model",
        "backend",
        "policy",
        "batch",
        "seq",
        "num_layers",
        "per_block",
        "residuals",
        "total_device_bytes",
        "total_host_bytes",
    ):
        assert key in rep
    for row in rep["residuals"]:
        assert {"name", "shape", "dtype", "bytes", "memory_kind", "count"} <= set(row)
        assert row["memory_kind"] in ("device", "pinned_host")
    assert (rep["batch"], rep["seq"], rep["num_layers"]) == (B, T, L)


def _parser():
    from zoo.cli import build_parser

    return build_parser()


def test_cli_residuals_json(capsys):
    args = _parser().parse_args(
        [
            "residuals",
            "mlp-s",
            "--remat",
            "offload-layer-input",
            "--batch",
            str(MB),
            "--layers",
            str(L),
            "--json",
        ]
    )
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["total_host_bytes"] == L * MACT
    stack = [r for r in out["residuals"] if r["scope"] == "stack"]
    assert [(r["name"], r["count"], r["bytes"], r["memory_kind"]) for r in stack] == [
        ("layer_input", L, L * MACT, "pinned_host")
    ]


def test_cli_residuals_precision(capsys):
    argv = ["residuals", "mlp-s", "--remat", "full", "--batch", str(MB), "--layers", str(L), "--json"]
    args = _parser().parse_args([*argv, "--precision", "bfloat16"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["precision"] == "bfloat16" and out["stack_device_bytes"] == L * MACT // 2


def test_cli_residuals_table(capsys):
    args = _parser().parse_args(
        ["residuals", "mlp-s", "--remat", "minimal", "--batch", str(MB), "--layers", str(L)]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "mlp_hidden" in out and "layer_input" in out and "pinned_host" in out


def test_cli_policies_json(capsys):
    args = _parser().parse_args(["remat-policies", "--json"])
    assert args.func(args) == 0
    listed = [p["name"] for p in json.loads(capsys.readouterr().out)]
    assert listed[: len(policy_names())] == policy_names()


def test_cli_unknown_policy_lists_valid_names():
    # zoo.cli.main prints a ZooError and exits with status 2; the message lists the policies
    for argv in (
        ["residuals", "transformer-xs", "--remat", "ful"],
        ["bench", "remat", "transformer-xs", "--policies", "full,ful"],
    ):
        args = _parser().parse_args(argv)
        with pytest.raises(ZooError, match=r"Did you mean 'full'.*Valid:.*minimal"):
            args.func(args)
    with pytest.raises(ZooError, match="Valid:"):
        residual_report(TRANSFORMER, "bogus")


def test_public_names():
    import zoo

    assert zoo.residual_report is residual_report
    assert not hasattr(zoo, "inspect")  # the old name of zoo.residuals is gone
