"""``zoo bench NAME``: every benchmark in :data:`zoo.bench.BENCH_MODULES`."""

from __future__ import annotations

from zoo import bench


def add_parser(sub) -> None:
    bench.add_bench_parser(sub)
