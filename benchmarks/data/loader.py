"""The token-store loader against what a training step consumes, the step time with the loader
on against batches made beforehand, and Grain's random-access pipeline beside zoo's gather.

    .venv/bin/python benchmarks/data/loader.py --store /tmp/zoo-data-bench/store-2000mb
    PYTHONPATH=/tmp/grain-site .venv/bin/python benchmarks/data/loader.py --store ... --grain

The run is ``python-docs-lm`` (transformer-s, batch 32 x 64 tokens) on the store, built by
``build_run`` as ``zoo train`` builds it. Rows:

- loader: ``local_batch`` (the loop's host batch: random windows of the store at the step's
  (seed, step) offsets, gathered from the memory map) alone, batches per second, the first
  time the windows are read (from the disk, unless the page cache holds them) and again;
- step, batches made beforehand: the engine's step on a list of placed-ready host batches;
- step, loader on: the same steps with each batch made by the loop's background thread
  (``zoo.train.prefetch.Prefetch``), as ``zoo train`` runs them.

The step rows run in interleaved rounds (``zoo.bench.common.time_in_rounds``); the figure is
the median over rounds of their ratio, beside a control: a second row of batches made
beforehand, against the first (what the machine's noise alone gives). With ``--grain`` (Grain installed beside the venv,
e.g. ``pip install --target /tmp/grain-site --no-deps grain==0.2.18 array_record==0.8.6
portpicker==1.6.0``), a ``grain.MapDataset`` over the same windows, batched and read on
Grain's threads, is timed against zoo's gather of the same windows (pages in memory for both;
three interleaved rounds, medians), and ``import grain`` is timed. Last, the seconds of
the checksum pass a resumed run makes over the store (``TokenStore.verify``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from zoo import recipes
from zoo.bench.common import median_ratio, ratio_spread, time_in_rounds
from zoo.commands import settings
from zoo.data.batches import read_windows
from zoo.train.prefetch import Prefetch
from zoo.train.run import build_run, local_batch


def loader_rate(run, steps: int) -> float:
    """Host batches per second of the loop's ``local_batch``."""
    rows = run.engine.layout.local_rows(run.batch_rows)
    tic = time.perf_counter()
    for step in range(steps):
        local_batch(run, step, rows)
    return steps / (time.perf_counter() - tic)


def steppers(run, steps: int) -> dict:
    engine, rows = run.engine, run.engine.layout.local_rows(run.batch_rows)
    made = [local_batch(run, step, rows)[0] for step in range(steps)]
    runs = {}

    def stepper(name: str, batches):
        state, frozen = engine.init_state(run.params, 0)
        runs[name] = {"state": state}

        def advance(n: int) -> None:
            for _ in range(n):
                runs[name]["state"], metrics = engine.train_step(
                    runs[name]["state"], frozen, engine.layout.place_local(next(batches), run.batch_rows)
                )
                float(metrics["loss"])  # the loop reads the loss every step

        return advance

    def cycle():
        while True:
            yield from made

    def make(step: int):  # on the prefetch thread: its CPU time is the loader's cost to a step
        tic = time.thread_time()
        batch = local_batch(run, step % steps, rows)[0]
        LOADER_CPU.append(time.thread_time() - tic)
        return batch

    prefetch = Prefetch(make, range(10**9))
    on = (batch for _, batch in prefetch)
    timed = {"precomputed": stepper("precomputed", cycle()), "loader on": stepper("loader on", on)}
    timed["precomputed again"] = stepper("precomputed again", cycle())  # the control: A against A
    return timed, prefetch


LOADER_CPU: list[float] = []  # CPU seconds of each batch the prefetch thread made


def grain_rows(run, batches: int) -> dict:
    tic = time.perf_counter()
    import grain

    imported = time.perf_counter() - tic
    tokens, seq, size = run.task.data.x_train, run.task.seq_len, run.recipe.train.batch_size
    vocab = run.task.data.vocab_size
    starts = np.concatenate(
        [
            np.random.default_rng([run.recipe.train.seed, s]).integers(0, tokens.shape[0] - seq, size)
            for s in range(batches)
        ]
    )

    class Windows:  # Grain's random-access source: one window per record
        def __len__(self):
            return len(starts)

        def __getitem__(self, i):
            return read_windows(tokens, starts[i : i + 1], seq + 1, vocab)[0]

    def ours() -> None:
        for s in range(batches):
            read_windows(tokens, starts[s * size : (s + 1) * size], seq + 1, vocab)

    def theirs() -> None:
        ds = grain.MapDataset.source(Windows()).batch(size)
        it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)))
        for _ in range(batches):
            next(it)

    # Both read windows whose pages are in memory after the warm-up: the figures compare the work.
    # One stepper call reads every batch once; its seconds per call become batches per second.
    times = time_in_rounds({"grain": lambda n: theirs(), "zoo": lambda n: ours()}, rounds=3)
    return {
        "import_s": imported,
        "grain_batches_per_s": batches / statistics.median(times["grain"]),
        "zoo_gather_batches_per_s": batches / statistics.median(times["zoo"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="a token store (zoo tokenize ... --out DIR)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round and stepper")
    parser.add_argument("--grain", action="store_true")
    args = parser.parse_args()
    recipe = settings.with_values(
        recipes.load_recipe("python-docs-lm"), {"data.dataset": f"tokens:{args.store}"}
    )
    run = build_run(recipe, choose_remat=False)
    tokens_per_batch = run.batch_rows * run.task.seq_len
    rate = loader_rate(run, 2000)  # windows of the first 2,000 steps: the pages read from the disk
    hot = loader_rate(run, 2000)  # the same again: the pages in memory
    print(f"store: {run.task.data.num_train:,} train tokens; batch {run.batch_rows} x {run.task.seq_len}")
    print(f"loader, first read: {rate:,.0f} batches/s ({rate * tokens_per_batch:,.0f} tokens/s)")
    print(f"loader, pages in memory: {hot:,.0f} batches/s ({hot * tokens_per_batch:,.0f} tokens/s)")
    rows, prefetch = steppers(run, 64)
    with prefetch:
        times = time_in_rounds(rows, args.rounds, args.steps)
    base, on = statistics.median(times["precomputed"]), statistics.median(times["loader on"])
    ratio = ratio_spread(times["loader on"], times["precomputed"])
    print(f"step, batches made beforehand: {base * 1e3:.1f} ms ({1 / base:,.1f} batches/s consumed)")
    print(
        f"step, loader on:               {on * 1e3:.1f} ms; median per-round ratio {ratio.median:.4f} "
        f"(quartiles {ratio.q1:.3f} to {ratio.q3:.3f} over {args.rounds} rounds)"
    )
    control = median_ratio(times["precomputed again"], times["precomputed"])
    print(f"control, a second precomputed row: median per-round ratio {control:.4f}")
    print(f"loader / consumption: {rate * base:,.0f}x")
    cpu = statistics.median(LOADER_CPU)
    print(f"loader thread: {cpu * 1e3:.3f} ms of CPU per batch, {cpu / base:.2%} of a step")
    store, tic = run.task.data.store, time.perf_counter()
    store.verify()  # what a resume reads: every file again, for its sha256
    size = sum(Path(path).stat().st_size for path in store.checksums) / 1e9
    print(f"resume's checksum pass: {time.perf_counter() - tic:.1f} s for the store's {size:.1f} GB")
    if args.grain:
        found = grain_rows(run, 500)
        print(
            f"grain: import {found['import_s']:.2f} s; MapDataset batches/s {found['grain_batches_per_s']:,.0f} "
            f"against zoo's gather {found['zoo_gather_batches_per_s']:,.0f} on the same windows"
        )


if __name__ == "__main__":
    main()
