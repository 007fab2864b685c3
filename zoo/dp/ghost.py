"""Ghost clipping: per-example gradient norms of the zoo models without per-example gradients.

DP-SGD needs ``||g_i||`` for every example ``i`` and then ``sum_i f_i g_i`` with
``f_i = min(1, C / ||g_i||)``.  :func:`zoo.dp.clipped_grad_sum` gets both by materialising
``g_i`` with ``vmap(grad)``, which costs B copies of the gradient.  Every parameter of the zoo
models sits in an op whose gradient is a cheap function of that op's input ``a`` and of the
gradient ``delta`` of its output, so we get all the ``delta`` in one ordinary backward pass and
work per op:

* dense ``z = a @ w + b``: ``g_w = sum_t a_t^T delta_t``.  Without a sequence axis
  ``||g_w||^2 = ||a||^2 ||delta||^2``; with one, either the Gram form
  ``sum_{t,s} (a_t . a_s)(delta_t . delta_s)`` or the per-example ``a^T delta`` itself,
  whichever is cheaper for the shape (:func:`dense_method`).  ``g_b = sum_t delta_t``.
* LayerNorm ``y = xhat * scale + b``: ``g_scale = sum_t delta_t * xhat_t``, ``g_b = sum_t delta_t``.
* token embedding ``e_t = W[tok_t]``: ``g_W`` scatters ``delta_t`` to row ``tok_t``; repeated
  tokens share a row, so ``||g_W||^2 = sum_{t,s} [tok_t == tok_s] (delta_t . delta_s)``.
* positional embedding ``p_t = P[t]``: distinct rows, ``||g_P||^2 = ||delta||^2``.

Everything runs in a functional "ghost forward" written on canonical params that mirrors
``zoo.models`` op for op (tests check its logits against both backends); its layer stack runs
through the same tagged, policy-wrapped scan body as the models, so remat policies apply.
There are two ways to get from there to the clipped sum (``method``):

* ``"bookkeeping"``: *probes*, zero tensors added to the output of every parametrised op.
  The gradient of ``sum_i L_i`` with respect to a probe is exactly the per-example output
  gradient (example ``i``'s output only feeds ``L_i``), so one activation-only backward pass
  gives every ``delta``; the forward also hands back each op's input.  After the norms,
  ``sum_i f_i g_i`` is assembled per op from the same ``a`` and ``f * delta`` -- one
  weight-gradient matmul per op, the work a normal backward does anyway.  Fastest, but every
  layer's ``a`` and ``delta`` are alive at once, whatever the remat policy.
* ``"backward"``: *taps*, identities on each op's output whose custom backward rule computes
  the op's per-example squared norms from its input (a residual, saved or recomputed as the
  remat policy says) and the output gradient passing through, and returns them as the
  gradient of a zero ``[B, leaves]`` array.  That backward runs with the parameters constant;
  a second, ordinary forward and backward of ``sum_i f_i L_i`` then gives the clipped sum.
  Nothing per layer is kept beyond what the policy keeps.

``"auto"`` (default, :func:`choose_method`) takes book-keeping without remat and the second
backward under a remat policy.  Measurements are in ``docs/ghost.md``.

Only the zoo MLP and Transformer are understood.  Anything else (:func:`unsupported_reason`)
falls back to the vmap path with a warning: a wrong norm would silently break the privacy
guarantee, a slow one only costs time.
"""

from __future__ import annotations

import functools
import numbers
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from zoo import names
from zoo.configs import MLPConfig, ModelConfig, TransformerConfig
from zoo.errors import ZooError, check_choice
from zoo.losses import per_example_loss
from zoo.models.canonical import flat_by_path, nest_by_path
from zoo.models.ops import ACTIVATIONS, causal_attention
from zoo.remat import RematPolicy, get_policy
from zoo.scan import StackPlan, layer_body, num_groups

__all__ = [
    "METHODS",
    "choose_method",
    "dense_method",
    "ghost_clipped_grad_sum",
    "ghost_forward",
    "supports",
    "unsupported_reason",
]

LN_EPS = 1e-5  # the models' LayerNorm epsilon (zoo.models.{nnx,eqx}.transformer.LN_EPS)
METHODS = ("auto", "bookkeeping", "backward")
STACK = "blocks"


# ----------------------------------------------------------------------------- support


def unsupported_reason(cfg: object) -> str | None:
    """Why ghost clipping cannot handle ``cfg`` (``None`` when it can)."""
    # Exact types: a subclass may build a different model, and a norm of the wrong model
    # would silently void the privacy guarantee.
    if type(cfg) is MLPConfig:
        if cfg.activation not in ACTIVATIONS:
            return f"MLP activation {cfg.activation!r} has no ghost forward"
        return None
    if type(cfg) is TransformerConfig:
        return None
    return (
        f"ghost clipping has a ghost forward only for the zoo MLPConfig and "
        f"TransformerConfig models, not {type(cfg).__name__}"
    )


def supports(cfg: object) -> bool:
    """True when :func:`ghost_clipped_grad_sum` computes exact norms for ``cfg``."""
    return unsupported_reason(cfg) is None


# ----------------------------------------------------------------------------- sites


@dataclass(frozen=True)
class Site:
    """One parametrised op: its canonical path, kind, parameter leaves and probe.

    ``kind`` is ``dense``, ``ln``, ``gather`` (token table) or ``pos`` (positional table).
    ``probe`` names the probe added to the op's output; the token and positional embeddings of
    a transformer share one probe, on their sum.
    """

    path: str
    kind: str
    leaves: tuple[str, ...]
    probe: str

    @property
    def stacked(self) -> bool:
        return self.path.split(".", 1)[0] == STACK


def sites(cfg: ModelConfig) -> tuple[Site, ...]:
    if isinstance(cfg, MLPConfig):
        return (
            Site("in_proj", "dense", ("w", "b"), "in_proj"),
            Site("blocks.dense", "dense", ("w", "b"), "blocks.dense"),
            Site("head", "dense", ("w", "b"), "head"),
        )
    embed = (
        Site("embed", "dense", ("w", "b"), "embed")
        if cfg.takes_features
        else Site("embed", "gather", ("w",), "embed")
    )
    return (
        embed,
        Site("pos", "pos", ("w",), "embed"),
        Site("blocks.ln1", "ln", ("scale", "b"), "blocks.ln1"),
        Site("blocks.attn.q", "dense", ("w",), "blocks.attn.q"),
        Site("blocks.attn.k", "dense", ("w",), "blocks.attn.k"),
        Site("blocks.attn.v", "dense", ("w",), "blocks.attn.v"),
        Site("blocks.attn.o", "dense", ("w",), "blocks.attn.o"),
        Site("blocks.ln2", "ln", ("scale", "b"), "blocks.ln2"),
        Site("blocks.mlp.up", "dense", ("w", "b"), "blocks.mlp.up"),
        Site("blocks.mlp.down", "dense", ("w", "b"), "blocks.mlp.down"),
        Site("ln_f", "ln", ("scale", "b"), "ln_f"),
        Site("head", "dense", ("w", "b"), "head"),
    )


# ----------------------------------------------------------------------------- the ghost forward


def _ln_hat(x):
    """(x - mean) / sqrt(var + eps), with the variance as E[x^2] - E[x]^2 (as flax computes it)."""
    mean = x.mean(-1, keepdims=True)
    var = jnp.maximum(0.0, (x * x).mean(-1, keepdims=True) - mean * mean)
    return (x - mean) * jax.lax.rsqrt(var + LN_EPS)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _tap(spec, z, aux, tap):
    """Identity on ``z``. Its backward passes the output gradient through unchanged and hands
    back, as the gradient of the zero array ``tap`` [B, leaves], the op's per-example squared
    gradient norms, computed from ``aux`` (the op's input) and that output gradient."""
    del spec, aux, tap
    return z


def _tap_fwd(spec, z, aux, tap):
    del spec, tap
    return z, aux


def _tap_bwd(spec, aux, dz):
    kind, leaves, force, rows = spec
    if kind == "dense":
        op = _Dense(aux, dz, leaves, force)
    elif kind == "ln":
        op = _LayerNorm(aux, dz, leaves)
    elif kind == "gather":
        op = _Gather(aux, dz, rows, force)
    else:
        op = _Positions(dz, rows)
    sq = op.sq()
    return dz, None, jnp.stack([sq[leaf] for leaf in leaves], axis=-1)


_tap.defvjp(_tap_fwd, _tap_bwd)


class _Hooks:
    """What the ghost forward does at the output ``z`` of each parametrised op.

    ``mode`` None: nothing (a plain forward).  ``"probe"``: add the zero probe named after the
    op's :attr:`Site.probe`; the gradient with respect to it is the op's output gradient, and
    the forward also returns the activations the norms need (``capture``).  ``"tap"``: route
    ``z`` through :func:`_tap` once per site, keyed by site path, so the backward pass itself
    leaves each op's per-example squared norms in the gradient of its tap -- nothing per layer
    is kept beyond what the remat policy keeps.
    """

    def __init__(self, mode=None, arrays=None, specs=None):
        self.mode, self.arrays, self.specs = mode, arrays or {}, specs or {}

    @property
    def capture(self) -> bool:
        return self.mode == "probe"

    def out(self, probe: str, z, aux: dict):
        """``aux``: {site path: the op's input as its norm needs it} for the sites writing z."""
        if self.mode == "probe" and probe in self.arrays:
            return z + self.arrays[probe]
        if self.mode == "tap":
            for path, a in aux.items():
                if path in self.arrays:
                    z = _tap(self.specs[path], z, a, self.arrays[path])
        return z

    def stacked(self) -> dict:
        return {k: v for k, v in self.arrays.items() if k.startswith(STACK + ".")}

    def layer(self, arrays) -> _Hooks:
        return _Hooks(self.mode, arrays, self.specs)


def _scan_stack(layer_fn: Callable, stacked, h, policy: RematPolicy):
    """``zoo.scan.scan_layers`` for a layer_fn returning ``(h, per-layer outputs)``: the same
    tagged, policy-wrapped body (nested policies as groups of ~sqrt(L) layers)."""
    body = layer_body(layer_fn, policy)
    leaves = jax.tree_util.tree_leaves(stacked)
    num_layers = leaves[0].shape[0] if leaves else 0
    if num_layers == 0:
        return h, None
    if not policy.nested:
        return jax.lax.scan(lambda carry, p: body(p, carry), h, stacked)
    groups = num_groups(num_layers)
    grouped = jax.tree_util.tree_map(lambda a: a.reshape(groups, num_layers // groups, *a.shape[1:]), stacked)

    def group_fn(group, carry):
        return jax.lax.scan(lambda c, p: body(p, c), carry, group)

    group_body = get_policy("full").wrap(group_fn)
    h, ys = jax.lax.scan(lambda carry, g: group_body(g, carry), h, grouped)
    return h, jax.tree_util.tree_map(lambda a: a.reshape(num_layers, *a.shape[2:]), ys)


def _run_stack(layer_fn, stacked_params, hooks: _Hooks, h, policy, prefix: int, stop: bool):
    """Layers [0:prefix) without hooks (frozen), then the rest with them.

    ``layer_fn(layer_params, h, hooks) -> (h, captures or None)``."""
    if prefix:
        first = jax.tree_util.tree_map(lambda a: a[:prefix], stacked_params)
        if stop:
            first = jax.lax.stop_gradient(first)
        h, _ = _scan_stack(lambda lp, c: (layer_fn(lp, c, _Hooks())[0], None), first, h, policy)
        stacked_params = jax.tree_util.tree_map(lambda a: a[prefix:], stacked_params)
    return _scan_stack(
        lambda lp, c: layer_fn(lp["params"], c, hooks.layer(lp["hooks"])),
        {"params": stacked_params, "hooks": hooks.stacked()},
        h,
        policy,
    )


def _mlp_forward(cfg: MLPConfig, params, hooks: _Hooks, x, policy, prefix, stop):
    act = ACTIVATIONS[cfg.activation]
    p = params["in_proj"]
    h = act(hooks.out("in_proj", x @ p["w"] + p["b"], {"in_proj": x}))

    def block(lp, h, hk):
        p = lp["dense"]
        hidden = checkpoint_name(
            hk.out("blocks.dense", h @ p["w"] + p["b"], {"blocks.dense": h}), names.MLP_HIDDEN
        )
        out = checkpoint_name(act(hidden), names.MLP_OUT)
        return out, ({"blocks.dense": h} if hk.capture else None)

    h, block_caps = _run_stack(block, params["blocks"], hooks, h, policy, prefix, stop)
    p = params["head"]
    logits = hooks.out("head", h @ p["w"] + p["b"], {"head": h})
    caps = {"in_proj": x, **(block_caps or {}), "head": h} if hooks.capture else {}
    return checkpoint_name(logits, names.LOGITS), caps


def _transformer_forward(cfg: TransformerConfig, params, hooks: _Hooks, x, policy, prefix, stop):
    seq = x.shape[1]
    if cfg.takes_features:
        embedded = x @ params["embed"]["w"] + params["embed"]["b"]
    else:
        embedded = jnp.take(params["embed"]["w"], x, axis=0)
    h = hooks.out("embed", embedded + params["pos"]["w"][:seq], {"embed": x, "pos": None})

    def block(p, h, hk):
        xhat1 = _ln_hat(h)
        y1 = hk.out("blocks.ln1", xhat1 * p["ln1"]["scale"] + p["ln1"]["b"], {"blocks.ln1": xhat1})
        a = p["attn"]

        def proj(name, tag, inp):
            path = "blocks.attn." + name
            return checkpoint_name(hk.out(path, inp @ a[name]["w"], {path: inp}), tag)

        q, k, v = (proj("q", names.ATTN_Q, y1), proj("k", names.ATTN_K, y1), proj("v", names.ATTN_V, y1))
        context = checkpoint_name(causal_attention(q, k, v, cfg.num_heads), names.ATTN_CONTEXT)
        h = h + proj("o", names.ATTN_OUT, context)
        xhat2 = _ln_hat(h)
        y2 = hk.out("blocks.ln2", xhat2 * p["ln2"]["scale"] + p["ln2"]["b"], {"blocks.ln2": xhat2})
        m = p["mlp"]
        hidden = checkpoint_name(
            hk.out("blocks.mlp.up", y2 @ m["up"]["w"] + m["up"]["b"], {"blocks.mlp.up": y2}), names.MLP_HIDDEN
        )
        gelu = jax.nn.gelu(hidden)
        out = checkpoint_name(
            hk.out("blocks.mlp.down", gelu @ m["down"]["w"] + m["down"]["b"], {"blocks.mlp.down": gelu}),
            names.MLP_OUT,
        )
        caps = (
            {"blocks.ln1": xhat1, "blocks.ctx": context, "blocks.ln2": xhat2, "blocks.gelu": gelu}
            if hk.capture
            else None
        )
        return h + out, caps

    h, block_caps = _run_stack(block, params["blocks"], hooks, h, policy, prefix, stop)
    xhat_f = _ln_hat(h)
    y = hooks.out("ln_f", xhat_f * params["ln_f"]["scale"] + params["ln_f"]["b"], {"ln_f": xhat_f})
    if cfg.is_classifier:
        y = y.mean(axis=1)
    logits = hooks.out("head", y @ params["head"]["w"] + params["head"]["b"], {"head": y})
    caps = {"embed": x, **(block_caps or {}), "ln_f": xhat_f} if hooks.capture else {}
    return checkpoint_name(logits, names.LOGITS), caps


def _forward(cfg, params, x, hooks: _Hooks, policy, prefix=0, stop=False):
    fwd = _mlp_forward if isinstance(cfg, MLPConfig) else _transformer_forward
    return fwd(cfg, params, hooks, x, policy, prefix, stop)


def ghost_forward(
    cfg: ModelConfig,
    params: dict,
    x: jax.Array,
    probes: dict | None = None,
    remat="none",
    *,
    frozen_prefix: int = 0,
    stop_prefix: bool = False,
):
    """``(logits, captures)`` of the ghost forward on full canonical ``params``.

    ``probes`` maps a probe name (:attr:`Site.probe`) to a zero tensor shaped like that op's
    output (stacked ops: ``[L - frozen_prefix, ...]``); missing probes are not added.  With
    probes the forward also returns the activations the norms need.  Layers
    ``[0:frozen_prefix)`` run without probes (and under ``stop_gradient`` when
    ``stop_prefix``).  The logits equal ``zoo.apply_fn(cfg, backend)``'s.
    """
    reason = unsupported_reason(cfg)
    if reason:
        raise ZooError(reason)
    hooks = _Hooks("probe", probes) if probes is not None else _Hooks()
    return _forward(cfg, params, x, hooks, _plan(remat).policy, frozen_prefix, stop_prefix)


def _plan(remat) -> StackPlan:
    if isinstance(remat, StackPlan):
        return remat
    return StackPlan(get_policy(remat))


def _probe_shapes(cfg: ModelConfig, x, layers: int) -> dict[str, tuple[int, ...]]:
    b = x.shape[0]
    if isinstance(cfg, MLPConfig):
        hid = (b, cfg.d_hidden)
        return {"in_proj": hid, "blocks.dense": (layers, *hid), "head": (b, cfg.num_classes)}
    t, d = x.shape[1], cfg.d_model
    row = (layers, b, t, d)
    out = {
        "embed": (b, t, d),
        "ln_f": (b, t, d),
        "head": (b, cfg.num_classes) if cfg.is_classifier else (b, t, cfg.vocab_size),
    }
    for name in ("ln1", "attn.q", "attn.k", "attn.v", "attn.o", "ln2", "mlp.down"):
        out["blocks." + name] = row
    out["blocks.mlp.up"] = (layers, b, t, cfg.d_ff)
    return out


# ----------------------------------------------------------------------------- per-op math


def dense_method(seq: int, d_in: int, d_out: int) -> str:
    """``"gram"`` or ``"materialise"`` for a dense op on a length-``seq`` sequence.

    Gram costs ~``seq^2 (d_in + d_out)`` per example and ``2 seq^2`` floats; materialising
    ``a^T delta`` costs ~``seq d_in d_out`` and ``d_in d_out`` floats, and its result also
    serves the clipped sum (no second weight-gradient matmul).  We materialise when that is at
    most the per-example size of the op's own activations, ``seq (d_in + d_out)`` -- which is
    exactly when it also takes fewer flops than the Gram form.
    """
    return "materialise" if d_in * d_out <= seq * (d_in + d_out) else "gram"


def _sq(x, axes):
    return jnp.sum(jnp.square(x), axis=axes)


def _keep(x, use):
    """Zero whole examples (leading axis) that must not enter the sum, NaNs included."""
    return jnp.where(use.reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype))


class _Op:
    """Per-example squared norms of one op's leaves, then its clipped-sum contribution.

    An op works on one (unstacked) layer: its arrays carry the example axis first.
    ``sq()`` -> {leaf: [B]}; ``grad(weights, use)`` -> {leaf: summed gradient}, ``weights``
    [B] the clip factors (0 where ``use`` is False).  Ops are pytrees (arrays as children,
    the method and leaf names static), so stacked sites ``vmap`` them over layers.
    """

    static: object = ()
    arrays: dict

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        jax.tree_util.register_pytree_node(cls, cls._flatten, cls._unflatten)

    def _flatten(self):
        keys = tuple(sorted(self.arrays))
        return tuple(self.arrays[k] for k in keys), (keys, self.static)

    @classmethod
    def _unflatten(cls, aux, children):
        op = object.__new__(cls)
        keys, op.static = aux
        op.arrays = dict(zip(keys, children, strict=True))
        return op


class _Dense(_Op):
    """``z = a @ w (+ b)``: a [B, d_in] or [B, T, d_in], delta [B, (T,) d_out]."""

    def __init__(self, a, d, leaves, force=None):
        a, d = a.astype(jnp.float32), d.astype(jnp.float32)
        if a.ndim == 2:
            method = "flat"
        else:
            method = force or dense_method(a.shape[1], a.shape[-1], d.shape[-1])
        self.static = (method, tuple(leaves))
        if method == "materialise" and "w" in leaves:
            self.arrays = {"g": jnp.einsum("bti,bto->bio", a, d)}
        elif "w" in leaves:
            self.arrays = {"a": a, "d": d}
        else:
            self.arrays = {}
        if "b" in leaves:
            self.arrays["gb"] = d if a.ndim == 2 else d.sum(axis=1)

    def sq(self):
        method, leaves = self.static
        arr, out = self.arrays, {}
        if "w" in leaves:
            if method == "flat":
                out["w"] = _sq(arr["a"], 1) * _sq(arr["d"], 1)
            elif method == "materialise":
                out["w"] = _sq(arr["g"], (1, 2))
            else:
                aa = jnp.einsum("bti,bsi->bts", arr["a"], arr["a"])
                dd = jnp.einsum("bto,bso->bts", arr["d"], arr["d"])
                out["w"] = jnp.sum(aa * dd, axis=(1, 2))
        if "b" in leaves:
            out["b"] = _sq(arr["gb"], 1)
        return out

    def grad(self, weights, use):
        method, leaves = self.static
        arr, out = self.arrays, {}
        if "w" in leaves:
            if method == "materialise":
                out["w"] = jnp.einsum("b,bio->io", weights, _keep(arr["g"], use))
            else:
                d = arr["d"]
                scaled = _keep(d, use) * weights.reshape((-1,) + (1,) * (d.ndim - 1))
                spec = "bi,bo->io" if method == "flat" else "bti,bto->io"
                out["w"] = jnp.einsum(spec, _keep(arr["a"], use), scaled)
        if "b" in leaves:
            out["b"] = weights @ _keep(arr["gb"], use)
        return out


class _LayerNorm(_Op):
    """``y = xhat * scale + b``: per-example grads are sum_t delta*xhat and sum_t delta."""

    def __init__(self, xhat, d, leaves):
        d = d.astype(jnp.float32)
        self.static = tuple(leaves)
        parts = {"scale": lambda: (d * xhat.astype(jnp.float32)).sum(axis=1), "b": lambda: d.sum(axis=1)}
        self.arrays = {leaf: parts[leaf]() for leaf in leaves}

    def sq(self):
        return {leaf: _sq(self.arrays[leaf], 1) for leaf in self.static}

    def grad(self, weights, use):
        return {leaf: weights @ _keep(self.arrays[leaf], use) for leaf in self.static}


def gather_method(seq: int, rows: int, width: int) -> str:
    """Token table: ``"gram"`` (token-equality-masked Gram, ~T^2 D per example) or
    ``"materialise"`` (scatter delta into a [V, D] table per example) when V D <= T^2."""
    return "materialise" if rows * width <= seq * seq else "gram"


class _Gather(_Op):
    """Token table [V, D]: example i's gradient scatters its delta rows to its token ids, so
    repeated tokens add up in one row before the norm is taken."""

    def __init__(self, tokens, d, rows, force=None):
        d = d.astype(jnp.float32)
        method = force or gather_method(d.shape[1], rows, d.shape[2])
        self.static = (method, rows)
        self.arrays = {"tok": tokens, "d": d}
        if method == "materialise":
            self.arrays = {"g": jax.vmap(lambda dt, tok: jax.ops.segment_sum(dt, tok, rows))(d, tokens)}

    def sq(self):
        method, _ = self.static
        if method == "materialise":
            return {"w": _sq(self.arrays["g"], (1, 2))}
        tok, d = self.arrays["tok"], self.arrays["d"]
        same = tok[:, :, None] == tok[:, None, :]
        dd = jnp.einsum("btd,bsd->bts", d, d)
        return {"w": jnp.sum(jnp.where(same, dd, 0.0), axis=(1, 2))}

    def grad(self, weights, use):
        method, rows = self.static
        if method == "materialise":
            return {"w": jnp.einsum("b,bvd->vd", weights, _keep(self.arrays["g"], use))}
        tok, d = self.arrays["tok"], self.arrays["d"]
        width = d.shape[-1]
        scaled = _keep(d, use) * weights[:, None, None]
        table = jnp.zeros((rows, width), jnp.float32)
        return {"w": table.at[tok.reshape(-1)].add(scaled.reshape(-1, width))}


class _Positions(_Op):
    """Positional table [max_len, D]: rows 0..T-1 get delta_t, each row once."""

    def __init__(self, d, rows):
        self.static = rows
        self.arrays = {"d": d.astype(jnp.float32)}

    def sq(self):
        return {"w": _sq(self.arrays["d"], (1, 2))}

    def grad(self, weights, use):
        summed = jnp.einsum("b,btd->td", weights, _keep(self.arrays["d"], use))
        return {"w": jnp.pad(summed, ((0, self.static - summed.shape[0]), (0, 0)))}


def _op_for(cfg, site: Site, params, caps, delta, force) -> _Op:
    """The op of one unstacked site, or of one layer of a stacked one (``params`` then being
    that layer's ``blocks`` subtree)."""
    if site.kind == "gather":
        return _Gather(caps["embed"], delta, cfg.vocab_size, force)
    if site.kind == "pos":
        return _Positions(delta, cfg.max_len)
    if site.kind == "ln":
        return _LayerNorm(caps[site.path], delta, site.leaves)
    return _Dense(_dense_input(cfg, site, params, caps), delta, site.leaves, force)


def _dense_input(cfg, site: Site, params, caps):
    """The input ``a`` of a dense site; LayerNorm outputs are rebuilt from the captured
    normalised input (cheaper to keep one than both)."""
    if isinstance(cfg, MLPConfig) or site.path == "embed":
        return caps[site.path]

    def ln_out(ln, xhat):
        return xhat * ln["scale"] + ln["b"]

    if site.path in ("blocks.attn.q", "blocks.attn.k", "blocks.attn.v"):
        return ln_out(params["ln1"], caps["blocks.ln1"])
    if site.path == "blocks.attn.o":
        return caps["blocks.ctx"]
    if site.path == "blocks.mlp.up":
        return ln_out(params["ln2"], caps["blocks.ln2"])
    if site.path == "blocks.mlp.down":
        return caps["blocks.gelu"]
    if site.path == "head":
        y = ln_out(params["ln_f"], caps["ln_f"])
        return y.mean(axis=1) if cfg.is_classifier else y
    raise AssertionError(f"no input rule for dense site {site.path}")


# ----------------------------------------------------------------------------- freezing


def _trainable_rows(plan, dotted: str, num_layers: int, prefix: int) -> np.ndarray | bool:
    """Stacked leaf: bool [L - prefix] of trainable rows; other leaves: one bool."""
    if plan is None:
        return np.ones(num_layers - prefix, bool) if dotted.startswith(STACK + ".") else True
    status = plan.trainable_rows(dotted)
    if status is None:
        return dotted not in plan.frozen_leaves
    rows = np.zeros(num_layers, bool)
    rows[list(status)] = True
    return rows[prefix:]


def _resolve_freeze(params, frozen, freeze_plan):
    """``(full params, plan or None)`` from the trainable tree, the frozen tree and the plan."""
    if frozen is None:
        if freeze_plan is not None and freeze_plan.frozen_count:
            raise ZooError(
                "ghost_clipped_grad_sum: freeze_plan freezes parameters but no "
                "frozen tree was given; pass frozen=plan.split(params)[1]"
            )
        return params, None
    if freeze_plan is not None:
        return freeze_plan.merge(params, frozen), freeze_plan
    t_flat, f_flat = flat_by_path(params), flat_by_path(frozen)
    overlap = sorted(set(t_flat) & set(f_flat))
    if overlap:
        raise ZooError(
            "ghost_clipped_grad_sum: the trainable and frozen trees share leaves "
            f"{overlap} (row-wise freezing of a stack); pass freeze_plan= to merge them"
        )
    if not f_flat:
        return params, None
    from zoo.freeze import resolve_freeze

    full = nest_by_path({**t_flat, **f_flat})
    return full, resolve_freeze(full, sorted(f_flat))


# ----------------------------------------------------------------------------- public API


def _is_static_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def ghost_clipped_grad_sum(
    cfg: ModelConfig,
    params: dict,
    x: jax.Array,
    y: jax.Array,
    *,
    l2_clip_norm: float | jax.Array,
    example_mask: jax.Array | None = None,
    frozen: dict | None = None,
    freeze_plan=None,
    remat: str | RematPolicy | StackPlan = "none",
    method: str = "auto",
    backend: str = "nnx",
    dense: str | None = None,
    microbatch_size: int | None = None,
    return_losses: bool = False,
):
    """Sum of per-example clipped gradients and the pre-clip per-example norms, by ghost norms.

    Same contract as :func:`zoo.dp.clipped_grad_sum` applied to
    ``per_example_loss(apply(merge(params, frozen), x[i:i+1]), y[i:i+1])``: ``params`` is the
    trainable tree (the whole canonical tree when nothing is frozen); ``frozen`` and
    ``freeze_plan`` (a :class:`zoo.freeze.FreezePlan`) give the rest -- without a plan the
    two trees must be disjoint leaf by leaf.  Frozen leaves and rows neither enter the norm nor
    get a gradient.  Examples with ``example_mask`` 0 contribute exactly zero (even with NaNs)
    and report norm 0; unmasked examples with a non-finite norm are dropped from the sum but
    their norm is returned.

    ``remat`` is a policy name, a :class:`~zoo.remat.RematPolicy` or a
    :class:`~zoo.scan.StackPlan` (whose ``frozen_prefix`` layers get no gradient, as in the
    models).  ``method``: ``"bookkeeping"`` (probes; the clipped sum is assembled from each
    op's captured input and output gradient), ``"backward"`` (norm taps, then a second
    forward and backward of ``sum_i f_i L_i``) or ``"auto"`` (the
    first without remat, the second under a remat policy; :func:`choose_method`).  ``dense``
    forces the norm form of every sequence op and the token table (``"gram"`` or
    ``"materialise"``, for tests and benchmarks); ``None`` picks per shape
    (:func:`dense_method`, :func:`gather_method`).

    A config the ghost forward does not know falls back, with a warning, to
    ``zoo.dp.clipped_grad_sum`` on ``zoo.apply_fn(cfg, backend)`` (``microbatch_size`` is
    passed on there; ghost clipping itself needs no microbatching).

    Returns ``(grad_sum, norms)``: ``grad_sum`` has the structure of ``params``; ``norms`` is
    float32 ``[B]``.  With ``return_losses`` also the per-example losses ``[B]`` of the same
    forward pass (saves the caller a forward for its metrics; the values of masked examples
    are unspecified).
    """
    check_choice("ghost clipping method", method, METHODS)
    if dense is not None:
        check_choice("dense norm method", dense, ("gram", "materialise"))
    if _is_static_number(l2_clip_norm) and not l2_clip_norm > 0:
        raise ValueError(
            f"l2_clip_norm must be > 0 (use float('inf') for no clipping); got {l2_clip_norm!r}."
        )
    b = x.shape[0]
    if y.shape[0] != b:
        raise ValueError(f"x and y disagree on the batch size: {x.shape[0]} vs {y.shape[0]}")
    if example_mask is None:
        keep = jnp.ones((b,), bool)
    else:
        if jnp.shape(example_mask) != (b,):
            raise ValueError(
                f"example_mask must have shape ({b},) to match the batch; got {jnp.shape(example_mask)}."
            )
        keep = jnp.asarray(example_mask) > 0

    reason = unsupported_reason(cfg)
    if reason:
        return _fallback(
            cfg,
            params,
            x,
            y,
            reason,
            l2_clip_norm,
            example_mask,
            frozen,
            freeze_plan,
            remat,
            backend,
            microbatch_size,
            return_losses,
        )

    full, plan = _resolve_freeze(params, frozen, freeze_plan)
    gp = prepare(cfg, plan, remat)
    if choose_method(gp.policy, method) == "backward":
        losses, sq = tap_pass(gp, full, x, y, dense)
        norms, weights, use = clip_factors(sq, keep, l2_clip_norm)
        # Batched backprop multiplies a zero cotangent by the example's own activations, and
        # 0 * NaN is NaN: dropped examples (masked, or with a non-finite gradient) rerun as a
        # copy of a kept one, with weight 0. Their contribution is then exactly zero.
        first = jnp.argmax(use)
        x2 = jnp.where(_rows(use, x), x, x[first])
        y2 = jnp.where(_rows(use, y), y, y[first])
        # The cond also skips the pass when no example is kept; and XLA's CPU buffer
        # assignment reuses the first pass's memory for a branch, not for straight-line code
        # (transformer-xs: 59 MB instead of 103 MB).
        grads = jax.lax.cond(
            jnp.any(use),
            lambda: weighted_backward(gp, params, frozen, x2, y2, weights),
            lambda: jax.tree_util.tree_map(jnp.zeros_like, params),
        )
        grads = jax.tree_util.tree_map(lambda g, p: g.astype(jnp.result_type(p)), grads, params)
        return (grads, norms, losses) if return_losses else (grads, norms)
    losses, caps, deltas = probe_pass(gp, full, x, y)
    sq, ops = squared_norms(gp, full, caps, deltas, b, dense)
    norms, weights, use = clip_factors(sq, keep, l2_clip_norm)
    grads = book_kept_sum(gp, full, ops, weights, use)
    return (grads, norms, losses) if return_losses else (grads, norms)


def choose_method(remat="none", method: str = "auto") -> str:
    """``"auto"`` -> ``"bookkeeping"`` without remat (fastest; keeps every op's input and
    output gradient, ~1.2x the non-private temp memory), ``"backward"`` under a remat policy
    (taps and a second forward and backward: the non-private temp memory under that same
    policy, where book-keeping would hold all layers' activations and undo the remat)."""
    check_choice("ghost clipping method", method, METHODS)
    if method != "auto":
        return method
    return "backward" if _plan(remat).policy.checkpoint else "bookkeeping"


# ----------------------------------------------------------------------------- the stages
# Book-keeping: prepare -> probe_pass -> squared_norms -> clip_factors -> book_kept_sum.
# Second backward: prepare -> tap_pass -> clip_factors -> weighted_backward.
# benchmarks/ghost.py times the stages.


@dataclass(frozen=True)
class GhostPlan:
    """Static choices for one call: the sites that need a probe, their trainable rows, the
    frozen prefix of the stack and the remat policy."""

    cfg: ModelConfig
    active: tuple[Site, ...]
    rows: tuple  # ((site path, ((leaf, bool rows or bool), ...)), ...)
    prefix: int
    policy: RematPolicy
    freeze: object  # FreezePlan | None

    def rows_of(self, path: str) -> dict:
        return dict(dict(self.rows)[path])


def prepare(cfg: ModelConfig, plan=None, remat="none") -> GhostPlan:
    """Which ops get probes: those with at least one trainable leaf (stacked: row)."""
    stack = _plan(remat)
    num_layers = cfg.num_layers
    prefix = max(stack.frozen_prefix, plan.frozen_prefix if plan is not None else 0)
    prefix = min(prefix, num_layers)
    rows, active = [], []
    for site in sites(cfg):
        site_rows = []
        for leaf in site.leaves:
            r = _trainable_rows(plan, f"{site.path}.{leaf}", num_layers, prefix)
            if np.any(r):
                site_rows.append((leaf, r))
        if site_rows:
            active.append(Site(site.path, site.kind, tuple(k for k, _ in site_rows), site.probe))
            rows.append((site.path, tuple(site_rows)))
    return GhostPlan(cfg, tuple(active), tuple(rows), prefix, stack.policy, plan)


def probe_pass(gp: GhostPlan, full, x, y):
    """One forward and one activation-only backward of ``sum_i L_i`` with respect to the
    probes (the parameters are constants here).  Returns ``(losses [B], captures, deltas)``."""
    cfg = gp.cfg
    shapes = _probe_shapes(cfg, x, cfg.num_layers - gp.prefix)
    probes = {k: jnp.zeros(shapes[k], jnp.float32) for k in sorted({s.probe for s in gp.active})}

    def losses_of(pr):
        logits, caps = _forward(cfg, full, x, _Hooks("probe", pr), gp.policy, gp.prefix)
        return per_example_loss(logits, y), caps

    losses, vjp, caps = jax.vjp(losses_of, probes, has_aux=True)
    (deltas,) = vjp(jnp.ones_like(losses))
    return losses, caps, deltas


def tap_pass(gp: GhostPlan, full, x, y, dense=None):
    """Forward and one activation-only backward (parameters constant) through norm taps.

    Returns ``(losses [B], sq [B])``: ``sq`` is what the taps' backward rules collected, the
    per-example squared gradient norms over the trainable leaves and rows.  Only what the
    remat policy saves is kept for the backward.
    """
    cfg = gp.cfg
    b = x.shape[0]
    layers = cfg.num_layers - gp.prefix
    taps, specs = {}, {}
    for site in gp.active:
        rows = cfg.vocab_size if site.kind == "gather" else (cfg.max_len if site.kind == "pos" else None)
        specs[site.path] = (site.kind, site.leaves, dense, rows)
        lead = (layers,) if site.stacked else ()
        taps[site.path] = jnp.zeros((*lead, b, len(site.leaves)), jnp.float32)

    def losses_of(tp):
        logits, _ = _forward(cfg, full, x, _Hooks("tap", tp, specs), gp.policy, gp.prefix)
        return per_example_loss(logits, y)

    losses, vjp = jax.vjp(losses_of, taps)
    (collected,) = vjp(jnp.ones_like(losses))
    sq = jnp.zeros((b,), jnp.float32)
    for site in gp.active:
        got = collected[site.path]
        for j, r in enumerate(gp.rows_of(site.path).values()):
            sq = sq + (jnp.asarray(r, jnp.float32) @ got[..., j] if site.stacked else got[:, j])
    return losses, sq


def weighted_backward(gp: GhostPlan, params, frozen, x, y, weights):
    """``sum_i weights_i grad L_i`` on the trainable ``params``: a plain forward and backward."""

    def weighted_loss(trainable):
        merged = gp.freeze.merge(trainable, frozen) if gp.freeze is not None else trainable
        logits, _ = _forward(gp.cfg, merged, x, _Hooks(), gp.policy, gp.prefix, stop=True)
        return jnp.sum(weights * per_example_loss(logits, y))

    return jax.grad(weighted_loss)(params)


def squared_norms(gp: GhostPlan, full, caps, deltas, batch_size: int, dense=None):
    """``(sum over trainable leaves of ||g_i||^2 [B], ops)``; stacked sites vmap over layers."""
    cfg = gp.cfg
    sq = None
    ops = {}
    for site in gp.active:
        delta = deltas[site.probe]
        if site.stacked:
            layer_params = jax.tree_util.tree_map(lambda a: a[gp.prefix :], full[STACK])
            layer_caps = {k: v for k, v in caps.items() if k.startswith(STACK + ".")}

            def make(p, c, d, s=site):
                op = _op_for(cfg, s, p, c, d, dense)
                return op.sq(), op

            op_sq, op = jax.vmap(make)(layer_params, layer_caps, delta)
            parts = [jnp.asarray(r, jnp.float32) @ op_sq[leaf] for leaf, r in gp.rows_of(site.path).items()]
        else:
            op = _op_for(cfg, site, full, caps, delta, dense)
            parts = list(op.sq().values())
        for part in parts:
            sq = part if sq is None else sq + part
        ops[site.path] = op
    if sq is None:  # nothing trainable
        sq = jnp.zeros((batch_size,), jnp.float32)
    return sq, ops


def clip_factors(sq, keep, l2_clip_norm):
    """``(norms, weights, use)`` exactly as the vmap path: factor min(1, C/||g||) (1 for a
    zero norm), 0 for masked or non-finite examples; masked examples report norm 0."""
    clip = jnp.asarray(l2_clip_norm, jnp.float32)
    norms = jnp.sqrt(sq)
    safe = jnp.where(norms > 0, norms, 1.0)
    factor = jnp.where(norms > clip, clip / safe, 1.0)
    use = keep & jnp.isfinite(norms)
    return jnp.where(keep, norms, 0.0), jnp.where(use, factor, 0.0), use


def book_kept_sum(gp: GhostPlan, full, ops, weights, use):
    """``sum_i f_i g_i`` per op from the captured inputs and output gradients, returned in the
    structure of the trainable tree."""
    out = {}
    for site in gp.active:
        op = ops[site.path]
        if site.stacked:
            layer_grads = jax.vmap(lambda o: o.grad(weights, use))(op)
            for leaf, g in layer_grads.items():
                if gp.prefix:
                    g = jnp.concatenate([jnp.zeros((gp.prefix, *g.shape[1:]), g.dtype), g])
                out[f"{site.path}.{leaf}"] = g
        else:
            for leaf, g in op.grad(weights, use).items():
                out[f"{site.path}.{leaf}"] = g
    for path, p in flat_by_path(full).items():  # frozen leaves: placeholders, dropped by the split
        out[path] = out[path].astype(jnp.result_type(p)) if path in out else jnp.zeros_like(p)
    grads = nest_by_path(out)
    if gp.freeze is not None:
        grads = gp.freeze.split(grads)[0]
    return grads


def _rows(flags, x):
    """``flags`` [B] shaped to broadcast against ``x`` [B, ...]."""
    return flags.reshape((-1,) + (1,) * (x.ndim - 1))


def _apply_merged(cfg, backend, frozen, freeze_plan):
    """``apply(trainable, x, remat)`` of the real model on the merged tree."""
    from zoo.api import apply_fn

    apply = apply_fn(cfg, backend)
    if frozen is None:
        return apply

    def merged(trainable, x, remat):
        if freeze_plan is not None:
            full = freeze_plan.merge(trainable, frozen)
        else:
            full = nest_by_path({**flat_by_path(trainable), **flat_by_path(frozen)})
        return apply(full, x, remat)

    return merged


def _fallback(
    cfg,
    params,
    x,
    y,
    reason,
    l2_clip_norm,
    example_mask,
    frozen,
    freeze_plan,
    remat,
    backend,
    microbatch_size,
    return_losses,
):
    from zoo.dp.clipping import clipped_grad_sum

    warnings.warn(
        f"ghost clipping unavailable ({reason}); using the vmap path (zoo.dp.clipped_grad_sum)", stacklevel=3
    )
    apply = _apply_merged(cfg, backend, frozen, freeze_plan)

    def loss(p, fz, xi, yi):
        del fz  # the frozen tree is closed over by ``apply``
        return per_example_loss(apply(p, xi[None], remat), yi[None])[0]

    return clipped_grad_sum(
        loss,
        params,
        x,
        y,
        l2_clip_norm=l2_clip_norm,
        example_mask=example_mask,
        microbatch_size=microbatch_size,
        frozen={},
        return_losses=return_losses,
    )
