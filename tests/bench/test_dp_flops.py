"""``zoo bench dp --flops`` (zoo.bench.dp_flops): XLA's counted FLOPs of each row, compile only,
with the layer stack counted once per layer."""

import functools

import pytest

import zoo
from zoo.bench.dp import bench_dp

# One worker computes the rows, and the two-layer rows once for both tests.
pytestmark = pytest.mark.xdist_group("dp-flops")


@functools.cache
def _flops(num_layers: int, method: str = "ghost") -> dict:
    """The rows of ``method`` and the non-private step (one row when ``method`` is that step)."""
    cfg = zoo.get_config("transformer-xs", num_layers=num_layers, d_model=32, d_ff=64, max_len=16)
    result = bench_dp(cfg, batch=2, seq=16, methods=[method], flops=True)
    return {r["method"]: r for r in result["rows"]}


def _step_flops(num_layers: int) -> float:
    """The non-private step's count; the two-layer rows are the ones the next test reads, the
    others compile the non-private step alone."""
    return _flops(num_layers, "ghost" if num_layers == 2 else "non-private")["non-private"]["flops"]


def test_every_layer_of_the_stack_is_counted():
    """A while loop's body is counted once by XLA: without the unrolled stack two and three
    layers would count the same. (Each layer adds about the same; XLA's rewrites of the first
    layer's backward make the differences agree only to a few percent.)"""
    counts = [_step_flops(n) for n in (1, 2, 3)]
    per_layer = counts[1] - counts[0]
    assert per_layer > 0
    assert counts[2] - counts[1] == pytest.approx(per_layer, rel=0.1)


def test_rows_report_flops_and_temp_against_the_non_private_step():
    rows = _flops(2)
    assert set(rows) == {"non-private", "ghost"} and rows["non-private"]["flop_ratio"] == 1.0
    assert rows["ghost"]["flop_ratio"] > 1.0 and rows["ghost"]["temp_bytes"] > 0
