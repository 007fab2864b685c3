"""The norm form of a sequence op, per site shape: the Gram form or the materialised
per-example gradient, by formula or as measured on this device.

A dense op ``z = a @ w`` on a sequence of ``T`` positions (a conv: on its output positions)
gets its per-example squared norms one of two ways (:mod:`zoo.dp.ghost.rules`):

* ``"gram"``: ``sum_{t,s} (a_t . a_s)(delta_t . delta_s)``, about ``T^2 (d_in + d_out)``
  multiply-adds an example; the clipped sum is then one more weight-gradient matmul
  ``sum_i a_i^T (f_i delta_i)``, ``T d_in d_out`` an example;
* ``"materialise"``: ``G_i = a_i^T delta_i`` itself, ``T d_in d_out`` an example, whose square
  is the norm and whose weighted sum ``sum_i f_i G_i`` is the clipped sum (no second matmul),
  at ``d_in d_out`` floats an example.

With the clipped sum from the same pieces (book-keeping, ``sums=True``) the materialised form
does fewer multiply-adds at every shape: it is the weight gradient of a non-private backward,
done per example. With the clipped sum from a second backward (``sums=False``) only the norms
count, and the Gram form wins where ``d_in d_out > T (d_in + d_out)``. Below
:data:`MATERIALISE_MIN_POSITIONS` positions the Gram form is taken either way (few KiB an
example, and the materialised contraction was 1.45-3.0x slower on CPU there).

Under book-keeping each form also leaves the backward pass with what its sum needs
(:mod:`zoo.dp.ghost.taps`): ``d_in d_out`` values an example materialised, ``T (d_in + d_out)``
in the Gram form, each written, zeroed first (the scan's stacked output) and read once. On a
chip whose matrix units outrun its memory that traffic decides as much as the multiply-adds:
:func:`formula` weighs the bytes at the device's :data:`BALANCE` (multiply-adds per byte that
take the same time). On a TPU v5e it takes the Gram form for GPT-2's blocks at T 256 and the
materialised one at T 1024 (where the per-example gradients are also the smaller of the two).
A CPU counts multiply-adds alone (balance 0), as measured there (``benchmarks/dp/ghost_forms.py``).

:func:`formula` is that rule, the offline default. :func:`choose` takes the choice measured on
this device for the exact shape when :mod:`zoo.dp.ghost.measure` has cached one (both forms
timed once, kept in ``$ZOO_CACHE_DIR/ghost-forms.json``, default ``~/.cache/zoo``), and the
formula otherwise. Reading the cache happens while a step is traced; nothing here runs a
device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import jax

from zoo.cache import ChoiceCache, digest

FORMS = ("gram", "materialise")
CACHE_FILE = "ghost-forms.json"
CACHE = ChoiceCache(CACHE_FILE)
MATERIALISE_MIN_POSITIONS = 32
# Multiply-adds per byte of HBM traffic that take as long, per platform: a TPU v5e's 98.5 T
# bf16 multiply-adds a second over its 820 GB/s (the chip profile's tpu_info); an NVIDIA GPU's,
# the H200 the device tool lends: 494.5 T over 4.8 TB/s (datasheet figures, not measured). Not
# listed: 0, multiply-adds alone.
BALANCE = {"tpu": 120.0, "gpu": 103.0}


def flops(form: str, seq: int, d_in: int, d_out: int, sums: bool) -> int:
    """Multiply-adds per example of one form: the norm, and the clipped sum's share when
    ``sums`` (the Gram form's second weight-gradient matmul; the materialised gradient is
    reused)."""
    if form == "materialise":
        return seq * d_in * d_out
    return seq * seq * (d_in + d_out) + (seq * d_in * d_out if sums else 0)


def traffic(form: str, seq: int, d_in: int, d_out: int, sums: bool, itemsize: int = 4) -> int:
    """Bytes per example a form moves beyond its operands: under book-keeping (``sums``) what
    it keeps for the clipped sum, zeroed, written and read; for the norms alone, its float32
    intermediates written and read (the per-example gradient, or the two Gram matrices)."""
    if sums:
        kept = d_in * d_out if form == "materialise" else seq * (d_in + d_out)
        return 3 * kept * itemsize
    return 2 * 4 * (d_in * d_out if form == "materialise" else 2 * seq * seq)


def formula(
    seq: int, d_in: int, d_out: int, sums: bool = False, itemsize: int = 4, balance: float = 0.0
) -> str:
    """The form of less cost, multiply-adds (:func:`flops`) plus ``balance`` times bytes
    (:func:`traffic`; the materialised one at a tie), and the Gram form below
    :data:`MATERIALISE_MIN_POSITIONS` positions."""
    if seq < MATERIALISE_MIN_POSITIONS:
        return "gram"

    def cost(form):
        return flops(form, seq, d_in, d_out, sums) + balance * traffic(form, seq, d_in, d_out, sums, itemsize)

    return "materialise" if cost("materialise") <= cost("gram") else "gram"


def balance() -> float:
    """:data:`BALANCE` of this device's platform."""
    return BALANCE.get(jax.devices()[0].platform, 0.0)


@dataclass(frozen=True)
class Shape:
    """One site shape as its rule sees it: ``batch`` examples (units) of ``seq`` positions,
    ``d_in`` -> ``d_out``, operands of ``dtype``, the clipped sum from the rule (``sums``)."""

    kind: str
    batch: int
    seq: int
    d_in: int
    d_out: int
    dtype: str
    sums: bool

    def formula(self) -> str:
        itemsize = jax.numpy.dtype(self.dtype).itemsize
        return formula(self.seq, self.d_in, self.d_out, self.sums, itemsize, balance())

    def flops(self, form: str) -> int:
        """Multiply-adds of ``form`` for the whole batch."""
        return self.batch * flops(form, self.seq, self.d_in, self.d_out, self.sums)


def cache_path() -> Path:
    return CACHE.path


def key(shape: Shape) -> str:
    """The cache key of a shape on this device and JAX."""
    device = jax.devices()[0]
    parts = {**shape.__dict__, "device": [device.platform, device.device_kind], "jax": jax.__version__}
    return digest(parts)


def read_cache() -> dict:
    return CACHE.read()  # an unreadable cache costs speed, never a run


@functools.lru_cache(maxsize=4)
def _cached(path: str, mtime: float) -> dict:
    del path, mtime  # the cache key: a rewritten file is read again
    return read_cache()


def measured(shape: Shape) -> dict | None:
    """The cached measurement of ``shape`` on this device (``{"form", "ms"}``), or None."""
    path = cache_path()
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    entry = _cached(str(path), mtime).get(key(shape))
    ok = isinstance(entry, dict) and entry.get("form") in FORMS
    return entry if ok else None


def timed(entry: dict | None) -> bool:
    """Whether a cached entry holds both forms' times (one written by hand may hold a form only)."""
    times = entry.get("ms") if isinstance(entry, dict) else None
    return isinstance(times, dict) and all(isinstance(times.get(f), int | float) for f in FORMS)


def choose(shape: Shape) -> str:
    """The measured form of ``shape`` when cached for this device, else :func:`formula`."""
    entry = measured(shape)
    return entry["form"] if entry is not None else shape.formula()


@dataclass(frozen=True)
class Choice:
    """How a rule picks its form: ``force`` (``"gram"`` or ``"materialise"``) for every op, or
    None for :func:`choose` per shape; ``sums``: the clipped sum comes from the rule
    (book-keeping) rather than from a second backward."""

    force: str | None = None
    sums: bool = False

    def pick(self, kind: str, batch: int, seq: int, d_in: int, d_out: int, dtype) -> str:
        if self.force is not None:
            return self.force
        return choose(Shape(kind, batch, seq, d_in, d_out, jax.numpy.dtype(dtype).name, self.sums))


def as_choice(force) -> Choice:
    """A :class:`Choice` from itself, a forced form's name, or None."""
    return force if isinstance(force, Choice) else Choice(force)
