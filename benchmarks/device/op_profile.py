"""Where a compiled step's time goes: XLA's per-operation profile from ``jax.profiler``.

:func:`op_times` traces a few calls of a step, reads the ``.xplane.pb`` back with
``jax.profiler.ProfileData``, and sums the device's operation events by name (a TPU's "XLA Ops"
line; on a CPU, XLA's worker threads). Each operation is matched with its HLO instruction in
the compiled program, whose metadata names the JAX operation and the named scopes it came from
(``f32_loss``, ``f32_softmax``, ``jvp(...)``, ``transpose(...)``). :func:`buckets` adds the
operations up by what they belong to, so two steps can be compared part by part.
"""

from __future__ import annotations

import collections
import glob
import re
import tempfile

import jax

# (bucket, pattern on "HLO-opcode jax-op-name"), the first match wins
BUCKETS = (
    ("attention kernel", r"splash|pallas|custom-call.*tpu"),
    ("softmax (XLA attention)", r"f32_softmax|softmax"),
    ("loss (log-softmax, cross-entropy)", r"f32_loss|cross_entropy|log_softmax|logsumexp"),
    ("layer norms", r"f32_norm_statistics|_ln|layer_norm"),
    ("optimizer and clip", r"adam|clip|optax|apply_updates|scale_by"),
    ("matmuls (backward)", r"^(convolution|dot|fusion).*transpose\(.*(dot_general|convolution)"),
    ("matmuls (forward)", r"^(convolution|dot|fusion).*(dot_general|convolution)"),
    ("matmuls (other)", r"^(convolution|dot) "),
    ("dtype converts", r"^(convert|fusion).*convert_element_type"),
    ("copies and transposes", r"^(copy|transpose|bitcast)"),
)


def _metadata(hlo_text: str) -> dict[str, tuple[str, str]]:
    """HLO instruction name -> (opcode, JAX op_name) from a compiled program's text."""
    meta = {}
    for line in hlo_text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = \S+ ([\w\-]+)\(", line)
        if m:
            op = re.search(r'op_name="([^"]*)"', line)
            meta[m.group(1)] = (m.group(2), op.group(1) if op else "")
    return meta


def _container(text: str) -> bool:
    """A while loop, call or conditional: its time is its body's operations', counted there."""
    return re.search(r"=.*?\b(while|call|conditional)\(", text) is not None and "custom-call(" not in text


def _device_events(trace) -> tuple[collections.Counter, dict]:
    """Nanoseconds per operation name, and each operation's event stats (on a TPU these say
    its ``hlo_category`` and JAX op, ``tf_op``)."""
    spent, stats = collections.Counter(), {}
    for plane in trace.planes:
        for line in plane.lines:
            tpu = plane.name.startswith("/device:TPU") and line.name == "XLA Ops"
            cpu = line.name.startswith("tf_XLAEigen")
            if tpu or cpu:
                for event in line.events:
                    # a TPU event is named by its HLO text: "%fusion.12 = bf16[...] fusion(...)"
                    name = re.match(r"%?([^\s=]+)", event.name).group(1)
                    if event.name.startswith(("ThunkExecutor", "SlinkyThreadPool")) or _container(event.name):
                        continue
                    spent[name] += event.duration_ns
                    stats.setdefault(name, {k: str(v) for k, v in event.stats})
    return spent, stats


def op_times(call, hlo_text: str, calls: int = 3) -> list[dict]:
    """``[{"op", "opcode", "jax", "ms"}]``: milliseconds per call of each operation, most first.
    ``call()`` runs one step and blocks on it."""
    call()
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            for _ in range(calls):
                call()
        found = glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)
        trace = jax.profiler.ProfileData.from_file(found[0])
        spent, stats = _device_events(trace)
    meta = _metadata(hlo_text)
    rows = []
    for op, ns in spent.most_common():
        opcode, jax_op = meta.get(op, ("?", ""))
        extra = stats.get(op, {})
        category = extra.get("hlo_category", "")
        jax_op = jax_op or extra.get("tf_op", "") or extra.get("long_name", "")
        rows.append({"op": op, "opcode": opcode, "category": category, "jax": jax_op, "ms": ns / calls / 1e6})
    return rows


def bucket_of(row: dict) -> str:
    key = f"{row['opcode']} {row['jax']} {row.get('category', '')}"
    return next((name for name, pattern in BUCKETS if re.search(pattern, key)), "other")


def buckets(rows: list[dict]) -> dict[str, float]:
    """Milliseconds per bucket (and ``total``)."""
    out = collections.Counter()
    for row in rows:
        out[bucket_of(row)] += row["ms"]
    out["total"] = sum(r["ms"] for r in rows)
    return dict(out)


def compare(profiles: dict[str, list[dict]]) -> str:
    """A markdown table of bucket milliseconds, one column per profiled step."""
    sums = {name: buckets(rows) for name, rows in profiles.items()}
    names = [b for b, _ in BUCKETS] + ["other", "total"]
    lines = ["| part | " + " | ".join(sums) + " |", "|---|" + "---|" * len(sums)]
    for part in names:
        lines.append(f"| {part} | " + " | ".join(f"{s.get(part, 0.0):.2f}" for s in sums.values()) + " |")
    return "\n".join(lines)


def top(rows: list[dict], n: int) -> str:
    lines = ["| ms | op | opcode | category | bucket | JAX op |", "|---|---|---|---|---|---|"]
    for r in rows[:n]:
        cells = (r["op"], r["opcode"], r.get("category", ""), bucket_of(r), r["jax"][-110:])
        lines.append(f"| {r['ms']:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
