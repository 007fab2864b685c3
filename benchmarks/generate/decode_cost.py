"""What one decode step of ``zoo.generate`` moves, read from the compiled decode loop (nothing runs).

    .venv/bin/python benchmarks/generate/decode_cost.py                   # gpt2-124m, llama-1b, batch 64; the CPU's compiler
    .venv/bin/python benchmarks/generate/decode_cost.py --tpu             # the TPU v5e compiler, no chip (libtpu installed)
    .venv/bin/python benchmarks/generate/decode_cost.py --models gpt2-124m --batches 1,64 --hlo DIR

The decode loop (``loop.decode_steps``: greedy, bf16 params and a bf16 cache, prompt ``--prompt``
and ``--new`` tokens, as ``benchmarks/device/decode.py`` runs it) is lowered from shapes and
compiled, for the CPU or, with ``--tpu``, for one chip of a TPU v5e topology through libtpu's
compiler (JAX's deviceless ahead-of-time compilation: no TPU needed, only the ``libtpu``
package). Per decode step it reports:

- **bytes** and **flops**: XLA's cost analysis of the loop's body, with the layer loop's body
  counted once per layer. (A compiled program's own ``cost_analysis()`` counts a while loop's
  body once, whatever its trip count, so it cannot say what a step costs.) Each body is
  analysed as the entry of a copy of the module.
- **cache**: the layout the cache has inside the loop; on a TPU, its tiles, and the bytes those
  tiles hold over the cache's own bytes (2.00: half of each tile is padding, read every step);
  and the same for what a step writes into it (128: one lane of each tile, through an update
  buffer 128 times the new keys' bytes).
- **copies**: bytes of whole-cache copies around the loop (a layout change at entry and exit).
- **TPU cycles**: the TPU compiler's own estimate, summed over the step's operations (relative:
  it leaves out the operations it gives no estimate, such as dynamic-update-slice).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
from jax._src import xla_bridge  # private: parse HLO text and analyse a module's cost
from jax._src.lib import xla_client
from jaxlib import _hlo

from zoo.generate import loop
from zoo.generate.sampling import Sampling
from zoo.models import canonical, decode
from zoo.models.registry import get_config

GREEDY = Sampling(temperature=0.0)
BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "pred": 1, "s8": 1}


def target(tpu: bool):
    """The device to compile for: the CPU, or chip 0 of a TPU v5e topology (deviceless)."""
    if not tpu:
        return jax.devices("cpu")[0]
    from jax.experimental import topologies

    # without a TPU host's bounds libtpu builds v5e topologies of its 2x2 host shape; a
    # single-device program for one of its chips is a lone v5e chip's program
    return topologies.get_topology_desc("v5e:2x2", "tpu").devices[0]


def compile_decode(cfg, batch: int, prompt: int, new: int, device, dtype: str = "bfloat16"):
    """The decode loop of ``batch`` prompts of ``prompt`` tokens and ``new`` new ones, params
    and cache in ``dtype``, compiled for ``device`` from shapes: what ``zoo.generate`` runs
    after its prefill."""
    sharding = jax.sharding.SingleDeviceSharding(device)

    def shaped(x):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    params = jax.eval_shape(lambda: jax.tree.map(lambda a: a.astype(dtype), canonical.init_params(cfg, 0)))
    width = loop.bucket(prompt)
    static = dict(length=width + loop.bucket(new), new=loop.bucket(new), keep_logits=False, dtype=dtype)
    if hasattr(decode, "row_lanes"):  # the rows zoo.generate lays out there (an older zoo: a head a row)
        static["lanes"] = decode.row_lanes(device.platform)
    ids, lengths = jax.ShapeDtypeStruct((batch, width), jnp.int32), jax.ShapeDtypeStruct((batch,), jnp.int32)
    seed = jax.ShapeDtypeStruct((), jnp.uint32)
    state = jax.eval_shape(
        lambda p, i, n, s: loop.prefill(cfg, "nnx", p, i, n, s, **static), params, ids, lengths, seed
    )
    until, stops = jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((8,), jnp.int32)
    args = [jax.tree.map(shaped, a) for a in (params, state, until, stops)]
    return loop.decode_steps.lower(cfg, "nnx", GREEDY, *args, width=width).compile()


def _computations(text: str) -> dict[str, list[str]]:
    found, name = {}, None
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{\s*$", line)
        if head:
            name = head.group(1)
            found[name] = []
        elif name:
            found[name].append(line)
    return found


def _loops(lines: list[str]) -> list[str]:
    """The bodies of the while loops among ``lines``."""
    return re.findall(r"\bwhile\(.*?body=%?([\w.\-]+)", "\n".join(lines))


def _as_entry(text: str, name: str) -> str:
    text = re.sub(r"^ENTRY ", "", text, flags=re.M)
    text = re.sub(rf"^%?{re.escape(name)} ", f"ENTRY %{name} ", text, count=1, flags=re.M)
    return re.sub(r"^HloModule .*$", "HloModule body", text, count=1, flags=re.M)


def _cost(text: str, name: str) -> dict:
    module = _hlo.hlo_module_from_text(_as_entry(text, name))
    return xla_client._xla.hlo_module_cost_analysis(xla_bridge.get_backend("cpu"), module)


def _decode_body(text: str) -> tuple[dict, str, str | None]:
    """The computations, the decode loop's body and the layer loop's body (None: unrolled)."""
    comps = _computations(text)
    entry = re.search(r"^ENTRY %?([\w.\-]+)", text, flags=re.M).group(1)
    body = max(_loops(comps[entry]), key=lambda b: len(comps[b]))
    layers = _loops(comps[body])
    return comps, body, (max(layers, key=lambda b: len(comps[b])) if layers else None)


def step_cost(text: str, num_layers: int) -> dict:
    """bytes and flops of one decode step: the decode body once, the layer body once per layer
    (the decode body's analysis already holds one)."""
    _, body, layer = _decode_body(text)
    outer = _cost(text, body)
    inner = _cost(text, layer) if layer else {}
    extra = num_layers - 1 if layer else 0
    return {k: outer.get(k, 0.0) + extra * inner.get(k, 0.0) for k in ("bytes accessed", "flops")}


def _tiled_bytes(shape: str) -> tuple[int, int]:
    """(bytes of the elements, bytes of the tiles) of an HLO shape such as
    ``bf16[12,64,6,640,128]{4,3,2,1,0:T(8,128)(2,1)}``."""
    m = re.match(r"(\w+)\[([\d,]*)\]\{([\d,]*)(?::T\((\d+),(\d+)\))?", shape)
    dtype, dims, order = m.group(1), [int(d) for d in m.group(2).split(",") if d], m.group(3)
    size = BYTES.get(dtype, 4)
    plain = math.prod(dims) * size
    if not m.group(4):
        return plain, plain
    minor = [int(i) for i in order.split(",")]
    padded = list(dims)
    rows, lanes = int(m.group(4)), int(m.group(5))
    padded[minor[0]] = -(-dims[minor[0]] // lanes) * lanes
    if len(minor) > 1:
        padded[minor[1]] = -(-dims[minor[1]] // rows) * rows
    return plain, math.prod(padded) * size


def cache_layout(text: str, cache_shape: tuple[int, ...]) -> dict:
    """The cache's layout in the decode body, its tiles' bytes over its own, and the bytes of
    whole-cache copies in the entry computation (a layout change around the loop)."""
    comps, body, _ = _decode_body(text)
    dims = ",".join(map(str, cache_shape))
    pattern = rf"\w+\[{dims}\]\{{[^}}]*\}}"
    inside = re.findall(pattern, "\n".join(comps[body]))
    layout = max(set(inside), key=inside.count) if inside else ""
    plain, tiled = _tiled_bytes(layout) if layout else (0, 0)
    entry = re.search(r"^ENTRY %?([\w.\-]+)", text, flags=re.M).group(1)
    copies = [ln for ln in comps[entry] if re.search(rf"= {pattern} copy\(", ln)]
    return {
        "cache_layout": layout,
        "cache_tiles_over_bytes": tiled / plain if plain else 1.0,
        "write_tiles_over_bytes": _write_padding(comps[body], pattern),
        "copy_bytes": sum(2 * _tiled_bytes(re.search(pattern, ln).group(0))[1] for ln in copies),
    }


def _write_padding(lines: list[str], pattern: str) -> float:
    """The tiles' bytes over the bytes of what a step writes into the cache: the update operand
    of the body's dynamic-update-slice of the whole cache (1.00 when nothing is padded)."""
    shapes = dict(
        re.findall(r"^\s*(?:ROOT )?%([\w.\-]+) = (\w+\[[\d,]*\]\{[^}]*\})", "\n".join(lines), flags=re.M)
    )
    updates = re.findall(rf"= {pattern} dynamic-update-slice\(%?[\w.\-]+, %?([\w.\-]+)", "\n".join(lines))
    sizes = [_tiled_bytes(shapes[u]) for u in updates if u in shapes]
    return sum(t for _, t in sizes) / sum(p for p, _ in sizes) if sizes else 1.0


def tpu_cycles(text: str, num_layers: int) -> int:
    """The TPU compiler's estimated cycles of one step, summed over its operations."""
    comps, body, layer = _decode_body(text)

    def cycles(name):
        return sum(int(c) for c in re.findall(r'"estimated_cycles":"(\d+)"', "\n".join(comps[name])))

    return cycles(body) + num_layers * (
        cycles(layer) if layer else 0
    )  # a while op has no estimate of its own


def row(name: str, batch: int, args, device) -> dict:
    cfg = get_config(name)
    compiled = compile_decode(cfg, batch, args.prompt, args.new, device, args.dtype)
    text = compiled.as_text()
    if args.hlo:
        Path(args.hlo).mkdir(parents=True, exist_ok=True)
        with gzip.open(
            Path(args.hlo) / f"decode-{name}-b{batch}-{args.dtype}-{device.platform}.txt.gz", "wt"
        ) as f:
            f.write(text)
    length = loop.bucket(args.prompt) + loop.bucket(args.new)
    lanes = {"lanes": decode.row_lanes(device.platform)} if hasattr(decode, "row_lanes") else {}
    shape = jax.eval_shape(lambda: decode.init_cache(cfg, batch, length, args.dtype, **lanes)).k.shape
    out = {"model": name, "batch": batch, "compiler": device.device_kind, "cache_shape": list(shape)}
    out.update(step_cost(text, cfg.num_layers))
    out.update(cache_layout(text, shape))
    if device.platform == "tpu":
        out["tpu_cycles"] = tpu_cycles(text, cfg.num_layers)
    return out


COLUMNS = (  # header, cell of a row
    ("model", lambda r: r["model"]),
    ("batch", lambda r: r["batch"]),
    ("compiler", lambda r: r["compiler"]),
    ("cache", lambda r: f"`{r['cache_layout']}`"),
    ("tiles / bytes", lambda r: f"{r['cache_tiles_over_bytes']:.2f}"),
    ("a step's write: tiles / bytes", lambda r: f"{r['write_tiles_over_bytes']:.2f}"),
    ("GB a step", lambda r: f"{r['bytes accessed'] / 1e9:.3f}"),
    ("GFLOP a step", lambda r: f"{r['flops'] / 1e9:.2f}"),
    ("copies GB", lambda r: f"{r['copy_bytes'] / 1e9:.2f}"),
    ("TPU Mcycles", lambda r: f"{r['tpu_cycles'] / 1e6:.2f}" if "tpu_cycles" in r else "-"),
)

OPTIONS = (  # flag, default, help
    ("--models", "gpt2-124m,llama-1b", "comma-separated model presets"),
    ("--batches", "64", "comma-separated batch sizes"),
    ("--prompt", 512, "prompt tokens"),
    ("--new", 128, "new tokens"),
    ("--dtype", "bfloat16", "of the params and the cache (bfloat16: a chip's)"),
    ("--hlo", "", "a folder for each compiled decode program's text, gzipped"),
    ("--json", "", "a file for the rows"),
)


def table(rows: list[dict]) -> str:
    head = "| " + " | ".join(name for name, _ in COLUMNS) + " |"
    return "\n".join(
        [head, "|---" * len(COLUMNS) + "|"]
        + ["| " + " | ".join(str(cell(r)) for _, cell in COLUMNS) + " |" for r in rows]
    )


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag, default, text in OPTIONS:
        parser.add_argument(flag, type=type(default), default=default, help=text)
    parser.add_argument(
        "--tpu", action="store_true", help="compile for a TPU v5e chip through libtpu, deviceless"
    )
    args = parser.parse_args(argv)
    device = target(args.tpu)
    rows = [
        row(name, int(b), args, device) for name in args.models.split(",") for b in args.batches.split(",")
    ]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()
