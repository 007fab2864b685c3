"""Named remat policies: a short string picks what a scanned block may keep for backward.

Each policy is built from ``jax.checkpoint_policies`` and the shared name vocabulary
(:mod:`zoo.names`). A policy is applied in one place only: the scan body of a layer stack
(:mod:`zoo.scan`). Models never change when the policy does.

``custom:NAME=device|offload|remat,...`` places each listed name on device, on host
(``pinned_host``) or recomputes it; names not listed are recomputed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import numpy as np

from zoo import names
from zoo.checks import is_int, require_choice
from zoo.errors import ZooError

cp = jax.checkpoint_policies

HOST = "pinned_host"
DEVICE = "device"
PLACEMENTS = ("device", "offload", "remat")


@dataclass(frozen=True)
class RematPolicy:
    """A named choice of what a scanned block saves.

    ``checkpoint`` False means the block is not wrapped in ``jax.checkpoint`` at all.
    ``nested`` True runs the stack as a two-level scan over groups of layers; ``recursive``
    True as one level per prime factor of the depth (recursive checkpointing). See
    :func:`zoo.scan.stack_levels`.
    ``replay_policy``, when set, governs the block's recomputation in the backward pass: the
    replay keeps only what that policy allows and recomputes the rest once more, which lowers
    the peak of the block's backward pass without changing what is saved across blocks.
    """

    name: str
    description: str
    checkpoint: bool = True
    saved_on_device: tuple[str, ...] = ()
    offloaded: tuple[str, ...] = ()
    save_dots: bool = False
    nested: bool = False
    recursive: bool = False
    jax_policy: Callable | None = field(default=None, compare=False, repr=False)
    replay_policy: Callable | None = field(default=None, compare=False, repr=False)

    @property
    def grouped(self) -> bool:
        """The stack runs as scans of checkpointed groups (``nested`` or ``recursive``)."""
        return self.nested or self.recursive

    def wrap(self, fn: Callable) -> Callable:
        """Wrap a block function in ``jax.checkpoint`` under this policy (or not at all)."""
        if not self.checkpoint:
            return fn
        if self.replay_policy is not None:
            # The barrier is the point here: without it XLA merges the third pass of the
            # elementwise ops into the replay, and the replay's peak comes back.
            fn = jax.checkpoint(fn, policy=self.replay_policy, prevent_cse=True)
        # prevent_cse=False: inside scan, XLA cannot CSE the recomputation away, and the
        # barrier would only cost speed.
        return jax.checkpoint(fn, policy=self.jax_policy, prevent_cse=False)


def _names_policy(saved: tuple[str, ...], offloaded: tuple[str, ...]) -> Callable:
    if not offloaded:
        return cp.save_only_these_names(*saved)
    return cp.save_and_offload_only_these_names(
        names_which_can_be_saved=list(saved),
        names_which_can_be_offloaded=list(offloaded),
        offload_src=DEVICE,
        offload_dst=HOST,
    )


def _named(name: str, description: str, saved=(), offloaded=(), nested=False, recursive=False) -> RematPolicy:
    return RematPolicy(
        name=name,
        description=description,
        saved_on_device=tuple(saved),
        offloaded=tuple(offloaded),
        nested=nested,
        recursive=recursive,
        jax_policy=_names_policy(tuple(saved), tuple(offloaded)),
    )


POLICIES: dict[str, RematPolicy] = {
    p.name: p
    for p in (
        RematPolicy("none", "no checkpoint: keep every residual autodiff wants", checkpoint=False),
        _named("full", "save nothing inside a block; recompute it all in the backward pass"),
        RematPolicy(
            "full-lean",
            "save what full saves; while replaying a block keep only matmul outputs (lower peak,"
            " elementwise ops run a third time)",
            jax_policy=cp.nothing_saveable,
            replay_policy=cp.dots_with_no_batch_dims_saveable,
        ),
        RematPolicy(
            "dots",
            "save matmul outputs without batch dims; recompute elementwise ops",
            save_dots=True,
            jax_policy=cp.dots_with_no_batch_dims_saveable,
        ),
        _named(
            "save-attn",
            "save q/k/v and the attention output projection",
            saved=(names.ATTN_Q, names.ATTN_K, names.ATTN_V, names.ATTN_OUT),
        ),
        _named(
            "minimal",
            "save every projection output (q/k/v, attn_out, mlp_hidden, mlp_out)",
            saved=names.PROJECTIONS,
        ),
        _named(
            "offload-layer-input",
            "offload each block input to pinned_host; recompute the rest",
            offloaded=(names.LAYER_INPUT,),
        ),
        _named(
            "offload-minimal", "offload every projection output to pinned_host", offloaded=names.PROJECTIONS
        ),
        _named("nested", "two-level scan over ~sqrt(L) groups: residuals O(sqrt L), not O(L)", nested=True),
        _named(
            "recursive",
            "recursive checkpointing: one scan level per prime factor of L (2s paired into 4s):"
            " residuals O(log L); each block recomputed once per level",
            recursive=True,
        ),
    )
}

CUSTOM_PREFIX = "custom:"


def parse_custom(spec: str) -> RematPolicy:
    """``custom:attn_q=device,layer_input=offload,mlp_hidden=remat`` -> RematPolicy."""
    body = spec[len(CUSTOM_PREFIX) :]
    saved, offloaded = [], []
    if not body.strip():
        raise ZooError(
            f"empty custom remat spec {spec!r}; write e.g. 'custom:attn_q=device,layer_input=offload'"
        )
    for item in body.split(","):
        if "=" not in item:
            raise ZooError(f"custom remat item {item!r} in {spec!r} must be NAME=device|offload|remat")
        name, placement = (part.strip() for part in item.split("=", 1))
        require_choice("activation name in custom remat spec", name, names.ALL)
        require_choice(f"placement for {name!r}", placement, PLACEMENTS)
        if name in saved or name in offloaded:
            raise ZooError(f"activation name {name!r} appears twice in {spec!r}")
        {"device": saved, "offload": offloaded, "remat": []}[placement].append(name)
    return _named(spec, "per-name placement: " + body, saved=saved, offloaded=offloaded)


def get_policy(name: str | RematPolicy) -> RematPolicy:
    """Look up a policy by name, or parse a ``custom:`` spec. Unknown names list the valid ones."""
    if isinstance(name, RematPolicy):
        return name
    if name.startswith(CUSTOM_PREFIX):
        return parse_custom(name)
    require_choice("remat policy", name, [*POLICIES, CUSTOM_PREFIX + "NAME=device|offload|remat,..."])
    return POLICIES[name]


def policy_names() -> list[str]:
    return list(POLICIES)


# --- `auto`: the fastest policy that fits a memory budget -----------------------------------

AUTO = "auto"  # a choice made per run (zoo.train.auto_remat), not a policy
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_bytes(text: str | int) -> int:
    """``"256MiB"``, ``"1.5GiB"``, ``"300MB"``, ``"4096"`` or an int -> bytes (> 0)."""
    if is_int(text):
        value, unit = float(text), ""
    else:
        import re

        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
        value, unit = (float(m.group(1)), m.group(2).lower()) if m else (0.0, "?")
        if unit not in _UNITS:
            raise ZooError(
                f"memory budget {text!r} is not a size: write e.g. 256MiB, 1.5GiB, 300MB or a byte "
                f"count (units: {', '.join(u for u in _UNITS if u)})"
            )
    size = int(value * _UNITS[unit])
    if size <= 0:
        raise ZooError(f"memory budget {text!r} must be more than 0 bytes")
    return size


def footprint(row: dict) -> int:
    """What a compiled step needs in device memory: temp, arguments (params, state, batch) and
    the outputs that do not reuse a donated argument's buffer (``output - alias``; rows
    without them, as the remat bench's, count temp plus arguments)."""
    return (
        int(row["temp_bytes"])
        + int(row["argument_bytes"])
        + int(row.get("output_bytes", 0))
        - int(row.get("alias_bytes", 0))
    )


HOST_KINDS = frozenset({"pinned_host", "unpinned_host"})


def _host_bytes(shardings, infos, donated_only: bool = False) -> int:
    """Bytes per device of the leaves whose sharding is in a host memory kind."""
    total = 0
    for sharding, info in zip(shardings, infos, strict=True):
        if getattr(sharding, "memory_kind", None) not in HOST_KINDS:
            continue
        if donated_only and not getattr(info, "donated", False):
            continue
        shape = sharding.shard_shape(tuple(info.shape))
        total += math.prod(shape) * np.dtype(info.dtype).itemsize
    return total


def step_bytes(compiled, host_separate: bool) -> dict:
    """A compiled step's bytes in device memory (``jax.stages.Compiled``): XLA's
    ``memory_analysis()`` temp, arguments, outputs and aliased (donated) bytes, and
    ``host_bytes``, its arguments in a host memory kind (``pinned_host``: an offloaded state).

    With ``host_separate`` (an accelerator, whose host memory is not its HBM) host-memory
    arguments and outputs are not device bytes. Where the analysis reports them apart
    (``host_argument_size_in_bytes`` and its kin) they are already out of the device figures;
    where it counts every memory kind together (a CPU does) they are taken out here. Without
    it (a CPU: ``device`` and ``pinned_host`` are the same RAM) every byte counts."""
    stats = compiled.memory_analysis()

    def get(field: str) -> int:
        return int(getattr(stats, field, 0) or 0) if stats is not None else 0

    is_arg = lambda x: isinstance(x, jax.stages.ArgInfo)  # noqa: E731
    args, in_shardings = jax.tree.leaves(compiled.args_info, is_leaf=is_arg), compiled.input_shardings
    # An argument the program drops as unused has no sharding: None keeps the leaves paired.
    in_shardings = jax.tree.leaves(in_shardings, is_leaf=lambda x: x is None)
    outs, out_shardings = jax.tree.leaves(compiled.out_info), jax.tree.leaves(compiled.output_shardings)
    host_args = _host_bytes(in_shardings, args)
    row = {
        "temp_bytes": get("temp_size_in_bytes"),
        "argument_bytes": get("argument_size_in_bytes"),
        "output_bytes": get("output_size_in_bytes"),
        "alias_bytes": get("alias_size_in_bytes"),
        "host_bytes": host_args,
    }
    if host_separate:
        host_outs = _host_bytes(out_shardings, outs)
        host_alias = min(_host_bytes(in_shardings, args, donated_only=True), host_outs)
        for field, host, reported in (
            ("argument_bytes", host_args, "host_argument_size_in_bytes"),
            ("output_bytes", host_outs, "host_output_size_in_bytes"),
            ("alias_bytes", host_alias, "host_alias_size_in_bytes"),
        ):
            if not get(reported):  # counted with the device's bytes: take them out
                row[field] = max(0, row[field] - host)
    return row
