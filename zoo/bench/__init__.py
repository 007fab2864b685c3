"""``zoo bench``: benchmarks that share one subcommand.

Each module named in :data:`BENCH_MODULES` defines ``add_bench(bench_sub)``, which adds its
own ``zoo bench NAME`` parser to ``bench_sub`` and may :func:`register` a Python entry point
in :data:`BENCHES`. To add a benchmark, append its module name to ``BENCH_MODULES``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

# Modules that define ``add_bench(bench_subparsers)``.
BENCH_MODULES: tuple[str, ...] = (
    "zoo.bench.remat",
    "zoo.bench.engine",
    "zoo.bench.finetune",
    "zoo.bench.dp",
    "zoo.bench.scale",
)

# Benchmark name -> its Python entry point (filled in by the modules as they are loaded).
BENCHES: dict[str, Callable] = {}


def register(name: str, fn: Callable) -> Callable:
    """Record ``fn`` as the Python entry point of ``zoo bench NAME``."""
    BENCHES[name] = fn
    return fn


def add_bench_parser(sub):
    """Add the ``bench`` subcommand to ``sub`` with one sub-subcommand per benchmark module."""
    parser = sub.add_parser("bench", help="benchmarks (zoo bench NAME --help)")
    bench_sub = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name in BENCH_MODULES:
        importlib.import_module(name).add_bench(bench_sub)
    return parser
