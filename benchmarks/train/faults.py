"""Kill `zoo train` at random points of a checkpoint write, resume, and tally (docs/recipes.md).

Each trial runs the real CLI in a subprocess (digits-mlp, 40 steps, a checkpoint every 10),
sends it SIGKILL at a uniformly random point of its step-30 save (a fraction of the duration
of the save before it, up to 1.2 of it), resumes it with ``--resume``, and compares the final
parameters with an uninterrupted run bit for bit. The harness is ``benchmarks/train/faultkit.py``, the
one ``tests/e2e/test_faults.py`` uses.

    .venv/bin/python benchmarks/train/faults.py [--trials 20] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import tempfile
from pathlib import Path

import faultkit  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill points")
    parser.add_argument("--json", action="store_true", help="print every trial as JSON too")
    args = parser.parse_args()
    if args.trials < 1:
        parser.error(f"--trials must be >= 1, got {args.trials}")
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        reference = work / "reference"
        faultkit.run_reference(reference)
        trials = []
        for i in range(args.trials):
            trial = faultkit.one_trial(work, reference, round(rng.uniform(0.0, 1.2), 3))
            trials.append(trial)
            print(
                f"trial {i + 1:2d}: kill at {trial['fraction']:.3f} of a save, left {trial['left']!r}, "
                f"resumed from step {trial['resumed_from']}, bitwise {trial['bitwise']}",
                flush=True,
            )
    ok = sum(t["bitwise"] for t in trials)
    left = collections.Counter(t["left"] for t in trials)
    resumed = collections.Counter(t["resumed_from"] for t in trials)
    print(
        f"{ok} of {len(trials)} resumed bitwise; the kill left: {dict(left)}; resumed from: {dict(resumed)}"
    )
    if args.json:
        print(json.dumps({"trials": trials, "bitwise": ok, "left": left, "resumed_from": resumed}))
    return 0 if ok == len(trials) else 1


if __name__ == "__main__":
    sys.exit(main())
