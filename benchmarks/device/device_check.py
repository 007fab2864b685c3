"""One device check: do zoo's gradients and memory claims hold on whatever ``jax.devices()`` offers?

    .venv/bin/python benchmarks/device/device_check.py --out device_check.json            # a GPU
    .venv/bin/python benchmarks/device/device_check.py --small --out /tmp/small.json      # CPU, tiny

Five sections, one table, one JSON file (docs/device.md says what each measures):
  gradients  every remat policy (offloads, nested, recursive), chunked attention and mlp_chunk
             against ``none`` under the suite's float rule, on transformer-s and llama-s
             (widened: d=512, T=1024), float32 and bf16;
  memory     per policy at L=12 and 24: device peak from ``memory_stats()`` (each row in its own
             process: the peak never resets) beside ``memory_analysis()``, host bytes, and
             whether each offload policy saves device memory against its on-device twin;
  time       median step time per policy (>= 10 timed steps after warm-up), ratio to
             ``none``, MFU (``zoo.train.throughput``: zoo's one FLOP count over the device's
             peak, from ``get_tpu_info`` on a TPU or a table by device kind);
  dp         ghost / non-private and jax_privacy.clipped_grad / ghost on mlp-s,
             transformer-s and llama-s (``zoo bench dp``'s code) at GPU batch sizes;
  attention  chunked against dense causal attention at T=8192: temp bytes and time.

Progress goes to stderr as it runs, a line per section and per row with the seconds since the
start (``--quiet``: none): a run takes minutes. A gradient mismatch is the first line of the
output and the exit status is 1. A row that raises (say a JAX 0.12-only feature on JAX 0.11)
is marked skipped with its error in the JSON, and the run goes on. ``--small`` runs the same
code at tiny sizes on a CPU, minutes of compiling (3 timed rounds instead of 10; each gradient
variant on one (model, dtype) pair in turn); ``tests/e2e/test_device_check.py`` runs it that
way.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

if "--small" in sys.argv[1:] and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    # Tiny runs are all compile time; LLVM's optimisation passes double it on CPU.
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"

# One row per line: rich wraps its table at 80 columns when the output is not a terminal.
os.environ.setdefault("COLUMNS", "160")
# The memory rows' child processes need the GPU memory that JAX would otherwise take up front
# (75%) in this process.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# device_costs, device_sections and devicekit sit beside this script: its folder is sys.path[0].
import device_costs  # noqa: E402
import device_sections  # noqa: E402
import devicekit  # noqa: E402
import jax  # noqa: E402

from zoo.train import throughput  # noqa: E402

SECTIONS = ("gradients", "memory", "time", "dp", "attention")
_WIDE = {"d_model": 512, "num_heads": 8, "d_ff": 2048, "max_len": 1024}
_TINY = {"d_model": 32, "num_heads": 4, "d_ff": 64, "max_len": 16, "vocab_size": 40}
_ALL = [None]  # every registered policy (filled in at run time)

SIZES = {
    "full": {
        "gradients": {
            **{"models": ["transformer-s", "llama-s"], "overrides": {**_WIDE, "num_layers": 4}},
            **{"batch": 8, "seq": 1024, "attention_chunk": 256, "mlp_chunk": 256},
            "chunk_policies": ["none", "full"],
        },
        "memory": {
            **{"model": "transformer-s", "overrides": _WIDE, "batch": 8, "seq": 1024},
            **{"depths": [12, 24], "policies": _ALL, "time_depth": 12, "rounds": 10},
            "precisions": ["float32", "bfloat16"],
        },
        "dp": {
            "models": {"mlp-s": {"batch": 4096}, "transformer-s": {"batch": 256}, "llama-s": {"batch": 256}},
            "rounds": 10,
            "steps": 1,
        },
        "attention": {"seq": 8192, "batch": 1, "heads": 8, "head_dim": 64, "chunk": 512, "rounds": 10},
    },
    "small": {
        "gradients": {
            **{"models": ["transformer-s", "llama-s"], "overrides": {**_TINY, "num_layers": 4}},
            **{"batch": 2, "seq": 16, "attention_chunk": 8, "mlp_chunk": 8, "round_robin": True},
            "chunk_policies": ["full"],
        },
        "memory": {
            **{"model": "transformer-s", "overrides": _TINY, "batch": 2, "seq": 16, "depths": [2, 4]},
            **{"policies": ["none", "full", "offload-layer-input"]},
            **{"time_depth": 2, "rounds": 3, "precisions": ["float32", "bfloat16"]},
        },
        "dp": {
            "models": {
                "mlp-s": {"batch": 8},
                "transformer-s": {"batch": 4, "seq": 16, "overrides": _TINY},
                "llama-s": {"batch": 4, "seq": 16, "overrides": _TINY},
            },
            "rounds": 3,
            "steps": 1,
            "bf16_models": ["llama-s"],  # the code path; a GPU run times every model
        },
        "attention": {"seq": 256, "batch": 1, "heads": 2, "head_dim": 16, "chunk": 64, "rounds": 3},
    },
}


def sizes(small: bool) -> dict:
    out = json.loads(json.dumps(SIZES["small" if small else "full"]))
    if out["memory"]["policies"] == _ALL:
        out["memory"]["policies"] = device_sections.policy_names()
    return out


def narrowed(size: dict, policies: str | None, depths: str | None) -> dict:
    """``size`` with the memory section cut to ``policies`` and ``depths`` (one device call's
    worth); ``none`` is kept, since every ratio is to it."""
    mem = size["memory"]
    if policies:
        known = mem["policies"]
        asked = [p.strip() for p in policies.split(",") if p.strip()]
        bad = [p for p in asked if p not in known]
        if bad:
            raise SystemExit(f"--policies: unknown {', '.join(bad)}. Valid: {', '.join(known)}")
        mem["policies"] = [p for p in known if p in asked or p == "none"]
    if depths:
        mem["depths"] = [int(d) for d in depths.split(",")]
        mem["time_depth"] = mem["depths"][0]
    return size


def _isolate(choice: str) -> bool:
    """Memory rows in processes of their own where the device has a peak to read."""
    return choice == "always" or (choice == "auto" and device_sections.device_peak() is not None)


def _jobs(args) -> int:
    """Gradient compiles and isolated memory rows at once: 4 on an accelerator, 1 on CPU."""
    return args.jobs or (1 if jax.devices()[0].platform == "cpu" else 4)


def run(args, say) -> dict:
    size = narrowed(sizes(args.small), args.policies, args.depths)
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    result = {
        "device": str(jax.devices()[0]),
        "device_kind": jax.devices()[0].device_kind,
        "platform": jax.devices()[0].platform,
        "jax": jax.__version__,
        "small": args.small,
        "sizes": size,
        "chip": dataclasses.asdict(chip) if (chip := throughput.chip()) else None,
        "sections": {},
        "seconds": {},
    }
    keep: dict = {}
    mem = size["memory"]
    steps = {
        "gradients": lambda: device_sections.gradients(
            size["gradients"], args.plant_bug, say, args.variants, _jobs(args)
        ),
        "memory": lambda: device_sections.memory(
            mem, _isolate(args.isolate), os.path.abspath(__file__), args.small, _jobs(args), keep, say
        ),
        "time": lambda: device_costs.step_times(mem, keep, say),
        "dp": lambda: device_costs.dp_cost(size["dp"], say) + device_costs.dp_bf16(size["dp"], say),
        "attention": lambda: device_costs.attention(size["attention"], say),
    }
    order = [name for name in SECTIONS if name in wanted]
    for i, name in enumerate(order, 1):
        if say:
            say(f"{name}: section {i} of {len(order)}")
        tic = time.perf_counter()
        result["sections"][name] = device_sections.guarded({}, lambda name=name: {"rows": steps[name]()})
        result["seconds"][name] = round(time.perf_counter() - tic, 2)
        if say:
            say(f"{name}: {result['seconds'][name]:.0f} s, {result['sections'][name]['status']}")
    return result


def mismatches(result: dict) -> list[str]:
    rows = result["sections"].get("gradients", {}).get("rows", [])
    return [
        f"GRADIENT MISMATCH {r['model']} {r['dtype']} {r['variant']}: {r['where']} is "
        f"{r['excess']:.3g}x the float rule's tolerance {r['tolerance']:.3g}"
        for r in rows
        if r.get("status") == "ok" and not r["passed"]
    ]


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def _cells(section: str, r: dict) -> tuple[str, str]:
    """(row label, one-line result) of a row for the table."""
    if r.get("status") != "ok":
        label = r.get("variant") or r.get("policy") or r.get("model") or r.get("attention") or "?"
        return str(label), "skipped: " + r.get("error", "")[:120]
    if section == "gradients":
        verdict = "pass" if r["passed"] else "MISMATCH"
        return f"{r['model']} {r['dtype']} {r['variant']}", f"{verdict}, worst {r['excess']:.2g} of tolerance"
    if section == "memory":
        peak = "n/a" if r["peak_bytes"] is None else _mib(r["peak_bytes"])
        text = f"peak {peak} MiB, analysis {_mib(r['analysis_bytes'])} MiB (temp {_mib(r['temp_bytes'])})"
        text += f", host {_mib(r['residual_host_bytes'])} MiB"
        if "temp_of_float32" in r:
            text += f", temp x{r['temp_of_float32']:.2f} of float32"
        if "saves_device_memory" in r:
            saved = f"{_mib(r['saved_bytes'])} MiB by {r['saved_basis'].split('_')[0]}"
            text += f", saves vs {r['offload_vs']}: {'yes' if r['saves_device_memory'] else 'NO'} ({saved})"
        return f"{r['policy']} L={r['num_layers']} {r['precision']}", text
    if section == "time":
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        ratio = f"{r['ratio_to_none']:.2f}" if "ratio_to_none" in r else "-"
        text = f"{r['step_ms']:.2f} ms, x{ratio} of none, MFU {mfu}"
        if "ratio_to_float32" in r:
            text += f", x{r['ratio_to_float32']:.2f} of float32"
        return f"{r['policy']} L={r['num_layers']} {r['precision']}", text
    if section == "dp" and r.get("precision") == "bfloat16":
        return f"{r['model']} B={r['batch']} bfloat16", (
            f"ghost/non-private {r['ghost_over_non_private']:.2f}, ghost bf16/float32 "
            f"{r['ghost_bf16_over_float32']:.2f} ({r['ghost_ms']:.2f} ms ghost)"
        )
    if section == "dp":
        return f"{r['model']} B={r['batch']}", (
            f"ghost/non-private {r['ghost_over_non_private']:.2f}, "
            f"jax_privacy/ghost {r['jax_privacy_over_ghost']:.2f} ({r['ghost_ms']:.2f} ms ghost)"
        )
    return (
        f"{r['attention']} T={r['seq']}",
        f"temp {_mib(r['temp_bytes'])} MiB, {r.get('step_ms', 0):.2f} ms"
        + (
            f" ({r['temp_of_dense']:.3f} / {r['time_of_dense']:.2f} of dense)"
            if r.get("temp_of_dense")
            else ""
        ),
    )


def table_rows(result: dict) -> list[tuple[str, str, str]]:
    rows = []
    for section, body in result["sections"].items():
        if body.get("status") != "ok":
            rows.append((section, "(section)", "skipped: " + body.get("error", "")[:120]))
        for r in body.get("rows", []):
            rows.append((section, *_cells(section, r)))
    return rows


def _print_table(result: dict, wall: float) -> None:
    from zoo.ui import print_table

    title = (
        f"device check on {result['device_kind']} ({result['platform']}, JAX {result['jax']}"
        f"{', --small' if result['small'] else ''}; {wall:.0f} s)"
    )
    print_table(title, ["section", "row", "result"], table_rows(result))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="tiny sizes for CPU (the test runs this)")
    p.add_argument("--out", default="device_check.json", help="JSON file to write")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="gradient compiles and memory child processes at once (4; CPU 1)",
    )
    p.add_argument(
        "--isolate",
        choices=("auto", "always", "never"),
        default="auto",
        help="memory rows in child processes (auto: where memory_stats() has a peak)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr (one per row)")
    p.add_argument("--progress", action="store_true", help=argparse.SUPPRESS)  # the default now
    p.add_argument("--variants", help="comma-separated gradient variants to check (default: all)")
    p.add_argument("--policies", help="comma-separated memory/time policies (default: every one)")
    p.add_argument("--depths", help="comma-separated memory depths (default: 12,24); time runs at the first")
    p.add_argument("--plant-bug", metavar="VARIANT", help="(tests) make VARIANT's gradient wrong")
    p.add_argument("--memory-child", metavar="JSON", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _memory_child(args) -> int:
    spec = json.loads(args.memory_child)
    size, precision = sizes(args.small)["memory"], spec.get("precision", "float32")
    row = device_sections.guarded(
        {}, lambda: device_sections.memory_row(size, spec["policy"], spec["depth"], precision=precision)
    )
    print(json.dumps(row))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.memory_child:
        return _memory_child(args)
    unknown = set(s.strip() for s in args.sections.split(",") if s.strip()) - set(SECTIONS)
    if unknown:
        print(f"unknown section(s) {sorted(unknown)}; valid: {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    say = None if args.quiet else devicekit.say
    tic = time.perf_counter()
    result = run(args, say)
    wall = time.perf_counter() - tic
    result["wall_s"] = round(wall, 1)
    bad = mismatches(result)
    result["mismatches"] = bad
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    for line in bad:
        print(line, flush=True)
    _print_table(result, wall)
    print(f"{'FAIL' if bad else 'ok'}: {len(bad)} gradient mismatches; JSON written to {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
