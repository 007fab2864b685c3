"""How fast a run trains, and where the rest of its time goes: the loop's one clock.

The rate a run reports is its steady-state training throughput: the span from the end of the
first step (it compiles) to the end of the latest, less the pauses for evaluation and
checkpoint writes, over the steps, rows and tokens in it. What the loop does between steps
(fetching the batch, the progress bar, the metrics lines) is in the span, so the rate is what a
user's run gets, not a bare step's; the pauses are reported beside it (``eval_sec``,
``checkpoint_sec``), with the start-up (``startup_sec``: restoring, compiling and the first
step) and the whole ``wall_sec``, so that what logging, evaluation and checkpoints cost can be
read off one summary.

MFU is the step's FLOPs (:func:`zoo.train.throughput.step_flops`, counting what the run
trains) over the span's seconds, against the peak of the devices the step runs on; where the
peak is not known (a CPU) it is None and the bar prints none. Under DP the rows counted are the
padded batch's (the realised batch size is not released).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from zoo.ui import rate_text


@dataclass(frozen=True)
class StepCounts:
    """What one step is: its rows, the tokens a row (an LM's ``seq_len``; None for a
    classifier), its FLOPs (None where the count does not cover the kind, a conv) and the
    peak FLOP/s of the devices it runs on, with where that came from (None: not known)."""

    rows: int
    tokens_per_row: int | None = None
    flops: float | None = None
    peak: float | None = None
    peak_source: str | None = None

    @property
    def unit(self) -> str:
        return "tok/s" if self.tokens_per_row else "ex/s"


def step_counts(run) -> StepCounts:
    """The :class:`StepCounts` of a built run: its padded rows, its task's tokens a row, the
    FLOPs of its step with its frozen weights and adapters counted as they train, and the
    peak of its devices in its compute dtype (one device's times the mesh's devices)."""
    from zoo.train import throughput

    seq = run.task.seq_len if run.task.type.tokenized else None
    try:
        flops = throughput.step_flops(run.cfg, run.batch_rows, seq or 1, run.freeze)
    except ValueError:  # a kind whose FLOPs are not counted per token (a conv)
        flops = None
    chip = throughput.chip()
    peak = None if chip is None else chip.peak(run.precision.compute_dtype.name) * run.engine.layout.devices
    return StepCounts(run.batch_rows, seq, flops, peak, None if chip is None else chip.source)


class Pace:
    """The loop's clock (``clock``: seconds, monotonic; a test passes a fake one). Made when
    the run starts; told when each step's results are in (:meth:`step_done`) and around each
    evaluation and checkpoint write (:meth:`pause`)."""

    def __init__(self, counts: StepCounts, clock: Callable[[], float] | None = None) -> None:
        self.counts, self._clock = counts, clock or time.perf_counter
        self._begin = self._clock()
        self._timed_from: float | None = None  # the first step's end
        self._paused = 0.0  # eval and checkpoint seconds since then
        self._seconds = 0.0  # the steady span at the latest step's end
        self.startup_sec: float | None = None
        self.timed_steps = self.timed_examples = 0
        self.eval_sec = self.checkpoint_sec = 0.0

    def step_done(self, examples: int) -> None:
        """A step's results are on the host; ``examples``: the rows it counts."""
        now = self._clock()
        if self._timed_from is None:  # the first step of this process: it compiled
            self._timed_from, self.startup_sec = now, now - self._begin
            return
        self.timed_steps += 1
        self.timed_examples += examples
        self._seconds = now - self._timed_from - self._paused

    @contextlib.contextmanager
    def pause(self, what: str) -> Iterator[None]:
        """Time an evaluation (``what="eval"``) or a checkpoint write (``"checkpoint"``): its
        seconds are reported as its own and left out of the rate."""
        tic = self._clock()
        try:
            yield
        finally:
            seconds = self._clock() - tic
            setattr(self, f"{what}_sec", getattr(self, f"{what}_sec") + seconds)
            self._paused += seconds if self._timed_from is not None else 0.0

    # --- the figures -------------------------------------------------------------------------
    @property
    def examples_per_sec(self) -> float | None:
        """Rows a second in steady state; None before a step past the first is in."""
        return self.timed_examples / self._seconds if self.timed_steps and self._seconds > 0 else None

    @property
    def tokens_per_sec(self) -> float | None:
        rate, tokens = self.examples_per_sec, self.counts.tokens_per_row
        return None if rate is None or not tokens else rate * tokens

    @property
    def mfu(self) -> float | None:
        """The step's FLOPs done in steady state over the devices' peak (None: not known)."""
        counts = self.counts
        if self.examples_per_sec is None or counts.flops is None or not counts.peak:
            return None
        return counts.flops * self.timed_steps / self._seconds / counts.peak

    def record(self) -> dict:
        """The rate fields of a ``metrics.jsonl`` train line."""
        lm = {"tokens_per_sec": self.tokens_per_sec} if self.counts.tokens_per_row else {}
        return {"examples_per_sec": self.examples_per_sec, **lm, "mfu": self.mfu}

    def text(self) -> str:
        """What the progress bar and the step lines show: ``12,345 tok/s, MFU 41.2%`` (an
        LM on an accelerator), ``1,234 ex/s`` (a classifier on a CPU), ``-`` before a rate."""
        rate = self.tokens_per_sec if self.counts.tokens_per_row else self.examples_per_sec
        if rate is None:
            return "-"
        return f"{rate_text(rate)} {self.counts.unit}" + ("" if self.mfu is None else f", MFU {self.mfu:.1%}")

    def summary(self) -> dict:
        """The summary's fields besides ``examples_per_sec``: the rates, the counts they came
        from and the seconds of each part of the run, up to now (``wall_sec``)."""
        counts = self.counts
        return {
            **({"tokens_per_sec": self.tokens_per_sec} if counts.tokens_per_row else {}),
            "mfu": self.mfu,
            "step_flops": counts.flops,
            "peak_flops": counts.peak,
            "peak_source": counts.peak_source,
            "timed_steps": self.timed_steps,
            "train_sec": round(self._seconds, 3),
            "startup_sec": None if self.startup_sec is None else round(self.startup_sec, 3),
            "eval_sec": round(self.eval_sec, 3),
            "checkpoint_sec": round(self.checkpoint_sec, 3),
            "wall_sec": round(self._clock() - self._begin, 3),
        }
