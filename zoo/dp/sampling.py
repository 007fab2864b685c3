"""Poisson sampling of training batches at a fixed (padded) shape.

DP-SGD's privacy amplification by subsampling (what the accountant in
:mod:`zoo.dp.accounting` assumes) needs every example to be included in each
step's batch independently with probability ``q``.  The realised batch size is
then random, ``Binomial(N, q)``, which does not fit jit's fixed shapes, so the
sampler returns ``padded_batch_size`` indices plus a 0/1 mask; padding slots
point at index 0 and have mask 0 (pass the mask to ``clipped_grad_sum``).

Cost is proportional to the padded batch, not to ``N``: instead of flipping
``N`` coins we draw the size ``k ~ Binomial(N, q)`` and then ``k`` distinct
indices uniformly at random.  This is the same distribution as independent
inclusion: under independent inclusion every subset of size ``k`` has
probability ``q^k (1-q)^(N-k)``, i.e. conditioned on its size the subset is
uniform, and its size is ``Binomial(N, q)``.

Truncation policy: if ``k`` exceeds ``padded_batch_size`` the excess examples
are dropped at random (equivalently, ``padded_batch_size`` distinct indices are
drawn uniformly) and a :class:`RuntimeWarning` is raised.  The accountant's
mechanism has no truncation; :meth:`PoissonSampler.for_expected_batch` sizes the
padding so the per-step truncation probability is at most ``truncation_prob``,
and :func:`zoo.dp.accounting.truncation_delta` adds what the event costs to the
reported delta (a DP run asks for at most ``delta / 1000``,
:func:`zoo.dp.accounting.truncation_budget`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from zoo.checks import require_int, require_number, require_positive_int

__all__ = [
    "SAMPLERS",
    "PoissonSampler",
    "SamplerKind",
    "UserDraws",
    "make_sampler",
    "padded_size_for",
    "register_sampler",
]

_INT32_MAX = np.iinfo(np.int32).max


def _check_q(q: float) -> float:
    q = require_number("sampling probability q", q, positive=True, hi=1.0, what="in (0, 1]")
    return q


def padded_size_for(num_examples: int, sampling_prob: float, truncation_prob: float = 1e-9) -> int:
    """Smallest ``s`` with ``P(Binomial(num_examples, sampling_prob) > s) <= truncation_prob``."""
    n = require_positive_int("num_examples", num_examples)
    q = _check_q(sampling_prob)
    if not (0.0 <= truncation_prob < 1.0):
        raise ValueError(f"truncation_prob must be in [0, 1); got {truncation_prob!r}.")
    if q == 1.0 or truncation_prob == 0.0:
        return n
    from scipy import stats  # on first use: scipy.stats takes most of a second to import

    s = stats.binom.isf(truncation_prob, n, q)
    s = n if not math.isfinite(s) else int(min(max(s, 0), n))
    # isf is a float search; make the answer exact with the survival function.
    while s < n and stats.binom.sf(s, n, q) > truncation_prob:
        s += 1
    while s > 0 and stats.binom.sf(s - 1, n, q) <= truncation_prob:
        s -= 1
    return max(s, 1)


@dataclass(frozen=True)
class PoissonSampler:
    """Fixed-shape Poisson sampler, deterministic in ``(seed, step)``.

    Attributes:
      num_examples: dataset size N (indices are ``0 .. N-1``).
      sampling_prob: inclusion probability q in (0, 1].
      padded_batch_size: length of the returned index/mask arrays.
      seed: non-negative int; step ``t`` uses ``np.random.default_rng([seed, t])``
        so a resumed run replays exactly the same batches.
    """

    num_examples: int
    sampling_prob: float
    padded_batch_size: int
    seed: int

    def __post_init__(self):
        n = require_positive_int("num_examples", self.num_examples)
        if n > _INT32_MAX:
            raise ValueError(f"num_examples {n} does not fit int32 indices.")
        _check_q(self.sampling_prob)
        require_positive_int("padded_batch_size", self.padded_batch_size)
        require_int("seed", self.seed, lo=0, what="a non-negative int")

    @property
    def expected_batch_size(self) -> float:
        return self.num_examples * self.sampling_prob

    @property
    def units(self) -> PoissonSampler:
        """The sampler of the privacy units, whose truncation the accounting bounds: itself
        (a record is the unit; :class:`zoo.dp.users.UserSampler`'s are its users)."""
        return self

    @classmethod
    def for_expected_batch(
        cls,
        num_examples: int,
        expected_batch_size: int,
        seed: int,
        truncation_prob: float = 1e-9,
        *,
        pad_to_multiple: int = 1,
        neighbours: bool = False,
        population: int | None = None,
        extra_rows: int = 0,
    ) -> PoissonSampler:
        """Sampler over ``num_examples`` with ``q = expected_batch_size / population``
        (default ``population = num_examples``; the audit counts its canaries in it).

        ``padded_batch_size`` is the smallest size whose truncation probability
        ``P(Binomial(N + extra_rows, q) > size)`` is at most ``truncation_prob``, rounded up
        to a multiple of ``pad_to_multiple`` (e.g. the clipping microbatch size).
        ``neighbours=True`` bounds it for one more example as well (the larger of
        two add/remove neighbours), as the privacy accounting of truncation needs.
        ``extra_rows``: rows drawn at rate ``q`` besides the sampler's own (black-box canaries).
        """
        n = require_positive_int("num_examples", num_examples)
        require_number("expected_batch_size", expected_batch_size, positive=True, what="> 0")
        pop = n if population is None else require_positive_int("population", population)
        q = expected_batch_size / pop
        if not q <= 1.0:
            raise ValueError(
                f"sampling probability q = expected_batch_size / num_examples = "
                f"{expected_batch_size}/{pop} = {q!r} is outside (0, 1]."
            )
        m = require_positive_int("pad_to_multiple", pad_to_multiple)
        rows = n + require_int("extra_rows", extra_rows, lo=0) + (1 if neighbours else 0)
        size = padded_size_for(rows, q, truncation_prob)
        size = -(-size // m) * m
        return cls(num_examples=n, sampling_prob=q, padded_batch_size=size, seed=seed)

    def batch_indices(self, step: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Indices, mask and realised size of the batch for ``step``.

        Returns ``(indices int32 [P], mask float32 [P], realised)`` with
        ``P = padded_batch_size``.  The first ``realised`` slots hold distinct
        sorted example indices with mask 1; the rest are index 0 with mask 0.
        ``realised == mask.sum()``.  If the drawn Binomial size exceeds ``P``
        (probability <= truncation_prob for ``for_expected_batch`` samplers) the
        batch is truncated to ``P`` random examples, ``realised`` is ``P`` and a
        ``RuntimeWarning`` is issued (its cost on delta: ``zoo.dp.accounting.truncation_delta``).
        """
        require_int("step", step, lo=0, what="a non-negative int")
        rng = np.random.default_rng([int(self.seed), int(step)])
        n, p = self.num_examples, self.padded_batch_size
        drawn = int(rng.binomial(n, self.sampling_prob))
        realised = drawn
        if drawn > p:
            warnings.warn(
                f"Poisson batch at step {step} drew {drawn} examples but the padded "
                f"batch holds {p}; dropping {drawn - p} at random (its probability is in the reported delta).",
                RuntimeWarning,
                stacklevel=2,
            )
            realised = p
        # Generator.choice without replacement uses a set-based (Floyd-style)
        # draw when realised << n, so this is O(realised), not O(n).
        chosen = np.sort(rng.choice(n, size=realised, replace=False))
        indices = np.zeros((p,), dtype=np.int32)
        mask = np.zeros((p,), dtype=np.float32)
        indices[:realised] = chosen
        mask[:realised] = 1.0
        return indices, mask, realised


# --- the sampler table ------------------------------------------------------------------------


@dataclass(frozen=True)
class UserDraws:
    """How a sampler row draws under ``dp.unit = "user"`` (:mod:`zoo.dp.users`, :mod:`zoo.dp.els_sampler`).

    ``make(users, records_per_user, expected_batch_size, seed, truncation_prob, *,
    pad_to_multiple, population, extra_rows)``, ``users`` the ``(offsets, rows)`` of
    :func:`zoo.data.users.group_rows` (``population``, ``extra_rows``: zoo audit's canary users,
    as :meth:`PoissonSampler.for_expected_batch`'s),
    returns a sampler as :class:`SamplerKind`'s, with ``units`` (what its truncation is
    bounded over), ``users``, ``records_per_user`` and ``algorithm`` (its name in the summary).

    ``per_record``: False, a user is drawn as one unit and clipped as one (ULS: the accounting
    counts users); True, each of a user's (at most ``k``) records is drawn on its own and
    clipped alone (ELS: the accounting counts ``N_users * k`` records, ``k`` per user, with the
    mixture of Gaussians of :mod:`zoo.dp.accounting`)."""

    make: Callable[..., object]
    per_record: bool = False


@dataclass(frozen=True)
class SamplerKind:
    """A row of the sampler table: ``make(num_examples, expected_batch_size, seed,
    truncation_prob, *, pad_to_multiple, population, extra_rows)`` (as
    :meth:`PoissonSampler.for_expected_batch`) returns a sampler with ``batch_indices(step) -> (indices, mask,
    realised)``, ``sampling_prob``, ``padded_batch_size`` and ``expected_batch_size``; None
    where the row draws only users. ``users`` says how the row draws under ``dp.unit =
    "user"`` (None: it does not).
    The accountant (:mod:`zoo.dp.accounting`) models Poisson subsampling: a sampler added here
    must draw batches that the accounting holds for. ``accountants``: the ones that can account
    it (None: every one)."""

    name: str
    description: str
    make: Callable[..., PoissonSampler] | None
    users: UserDraws | None = None
    accountants: tuple[str, ...] | None = None

    @property
    def privacy_units(self) -> tuple[str, ...]:
        """The privacy units (``dp.unit``) the row draws."""
        return (("record",) if self.make else ()) + (("user",) if self.users else ())


SAMPLERS: dict[str, SamplerKind] = {}


def register_sampler(kind: SamplerKind) -> SamplerKind:
    if kind.name in SAMPLERS:
        raise ValueError(f"sampler {kind.name!r} is already registered")
    SAMPLERS[kind.name] = kind
    return kind


def make_sampler(
    name: str,
    num_examples: int,
    expected_batch_size: float,
    seed: int,
    truncation_prob: float,
    *,
    pad_to_multiple: int = 1,
    population: int | None = None,
    extra_rows: int = 0,
):
    """The sampler ``name`` (a row of :data:`SAMPLERS`) for a run, padded so that a draw from
    either of two neighbouring datasets is truncated with probability at most
    ``truncation_prob`` per step (``population``, ``extra_rows``: see
    :meth:`PoissonSampler.for_expected_batch`)."""
    if name not in SAMPLERS or SAMPLERS[name].make is None:
        able = ", ".join(n for n, kind in SAMPLERS.items() if kind.make)
        raise ValueError(f"sampler {name!r} does not draw records; the samplers of records: {able}")
    return SAMPLERS[name].make(
        num_examples,
        expected_batch_size,
        seed,
        truncation_prob,
        pad_to_multiple=pad_to_multiple,
        population=population,
        extra_rows=extra_rows,
    )


def add_user_draws(name: str, draws: UserDraws) -> SamplerKind:
    """Give row ``name`` its draws under ``dp.unit = "user"``, from the module that holds its
    user sampler (:mod:`zoo.dp.users` gives ``poisson`` its ULS draws)."""
    kind = SAMPLERS[name]
    if kind.users is not None:
        raise ValueError(f"sampler {name!r} already draws users")
    SAMPLERS[name] = dataclasses.replace(kind, users=draws)
    return SAMPLERS[name]


register_sampler(
    SamplerKind(
        "poisson",
        "each unit (a record; under dp.unit = 'user' a user, ULS) joins each step's batch "
        "independently with probability q, padded to a fixed shape",
        functools.partial(PoissonSampler.for_expected_batch, neighbours=True),
    )  # its ULS draws: zoo.dp.users (add_user_draws)
)
