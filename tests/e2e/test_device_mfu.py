"""benchmarks/device/mfu.py (and decode.py) at --small on a CPU (splash in Pallas' interpret mode), so the
benchmark the TPU runs cannot rot: both steps compile and run on one shared state each, the
table has every row, and the per-operation profile adds up to what its operations took.
Figures are not asserted: speed lives in the benchmark's output, not in tests."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.numerics import assert_close

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device" / "mfu.py"


def sys_path_edits(source: str) -> list[int]:
    """Lines of ``source`` that change ``sys.path`` (``insert``, ``append``, ``extend``,
    ``remove``, or an assignment)."""
    is_path = lambda n: (  # noqa: E731
        isinstance(n, ast.Attribute) and n.attr == "path" and getattr(n.value, "id", None) == "sys"
    )
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_path(node.func.value):
            lines += [node.lineno] if node.func.attr in ("insert", "append", "extend", "remove") else []
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            lines += [node.lineno for t in targets if is_path(t)]
    return sorted(lines)


def test_no_benchmark_script_edits_sys_path():
    """benchmarks/README.md: the scripts make no sys.path edits; a device script finds its
    neighbours (devicekit, plain_step, op_profile) through sys.path[0], its own folder."""
    assert sys_path_edits("import sys\nsys.path.insert(0, 'x')\nsys.path = []\n") == [2, 3]
    root = SCRIPT.parents[1]
    edits = {str(p.relative_to(root)): sys_path_edits(p.read_text()) for p in sorted(root.rglob("*.py"))}
    assert {name: lines for name, lines in edits.items() if lines} == {}


@pytest.mark.slow
def test_the_mfu_benchmark_runs_both_steps_and_profiles_them(tmp_path):
    out = tmp_path / "mfu.json"
    cmd = [sys.executable, str(SCRIPT), "--small", "--zoo", "splash:none", "--plain", "splash:none"]
    cmd += ["--profile", "zoo:splash:none:2", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [r["row"] for r in result["rows"]] == ["plain:splash:none:2", "zoo:splash:none:2"]
    for row in result["rows"]:
        assert row["ms"] > 0 and row["tokens_per_s"] > 0 and row["mfu"] is None  # no peak for a CPU
        assert f"| {row['row']} |" in done.stdout
    ops = result["profiles"]["zoo:splash:none:2"]
    assert ops and all(op["ms"] >= 0 for op in ops)
    assert any("splash" in op["jax"] for op in ops), "the kernel's operations are named in the profile"
    assert "| total |" in done.stdout


@pytest.mark.slow
def test_the_decode_benchmark_runs_against_its_roofline(tmp_path):
    """benchmarks/device/decode.py --small: every row decodes its tokens, and the roofline is the
    bytes a step must read (bf16 params, the cache at its mean length) over the bandwidth."""
    script = SCRIPT.parent / "decode.py"
    out = tmp_path / "decode.json"
    done = subprocess.run(
        [sys.executable, str(script), "--small", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["batch"], r["tokens"]) for r in rows] == [(1, 8), (2, 16)]
    for r in rows:
        step_bytes = r["param_bytes"] + r["cache_bytes_read"]
        assert r["roofline_tokens_per_s"] == pytest.approx(r["batch"] * 819e9 / step_bytes)
        assert r["of_roofline"] == pytest.approx(r["decode_tokens_per_s"] / r["roofline_tokens_per_s"])


def _plain_step():
    import importlib.util

    spec = importlib.util.spec_from_file_location("plain_step", SCRIPT.parent / "plain_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.numerics
def test_the_plain_steps_attentions_give_one_loss_and_one_update():
    """plain_step's ``sdpa`` (jax.nn.dot_product_attention, the cuDNN kernel on a GPU) takes
    [B, T, H, d] without the transposes of the einsum form: on a CPU both are XLA's arithmetic,
    so a head or causal-mask mix-up shows as a different loss and update."""
    import jax
    import jax.numpy as jnp
    import optax

    plain = _plain_step()
    vocab, d, layers, heads, seq = 64, 32, 2, 4, 16
    params = plain.init(jax.random.key(0), vocab, d, layers, heads, 4 * d, seq)
    x = jax.random.randint(jax.random.key(1), (2, seq), 0, vocab)
    y = jnp.roll(x, -1, axis=1)
    optimizer = optax.sgd(1.0)
    out = {}
    for attention in ("xla", "sdpa"):
        step = plain.make_step(optimizer, heads, attention, "none", dtype=jnp.float32)
        state = jax.tree.map(jnp.copy, params)
        new, _, loss = step(state, optimizer.init(state), x, y)
        out[attention] = (loss, new)
    assert_close(out["sdpa"], out["xla"], n=d * seq, what="sdpa against the einsum attention")
    with pytest.raises(ValueError, match="unknown plain attention 'cudnn'; valid: xla, splash, sdpa"):
        plain.make_step(optimizer, heads, "cudnn", "none")
