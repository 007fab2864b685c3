"""What ``session.sh`` reports: a resumed run against its uninterrupted twin, and the session's
table.

    python benchmarks/device/session_report.py same-losses RESUMED_RUN TWIN_RUN
    python benchmarks/device/session_report.py table OUT/steps.tsv --logs LOGS --out OUT

``same-losses``: the two runs' ``metrics.jsonl`` step by step: every logged loss, gradient norm
and eval loss of one equals the other's, bitwise (a resumed run is the same program on the same
state: docs/train.md), and the first run really resumed (its ``summary.json`` names the step).
Exit 1 otherwise.

``table``: one row per step of ``steps.tsv`` (status, exit, seconds) with what the CLI printed
for the runs: the rate of its last progress line (examples a second, padded rows under DP),
tokens a second (that rate times the recipe's ``data.seq_len``), the summary's MFU where the CLI
reports one, the last loss and eval loss. Written to ``session.md`` and ``session.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
from pathlib import Path

COMPARED = ("loss", "grad_norm", "eval_loss")
PROGRESS = re.compile(r": step (\d+)/(\d+)\s+([\d,.]+) (ex|tok)/s")
INTERRUPTED = re.compile(r"interrupted after step (\d+)")


def records(run: Path) -> dict[int, dict]:
    """``metrics.jsonl`` of ``run``, the records of each step merged (a step's train and eval
    lines are two records)."""
    out: dict[int, dict] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        out.setdefault(int(record["step"]), {}).update(record)
    return out


def same_losses(resumed: Path, twin: Path) -> tuple[bool, str]:
    summary = json.loads((resumed / "summary.json").read_text())
    if not summary.get("resumed_from_step"):
        return False, f"{resumed} did not resume (its summary has no resumed_from_step)"
    a, b = records(resumed), records(twin)
    steps = sorted(set(a) & set(b))
    pairs = [(s, k) for s in steps for k in COMPARED if k in a[s] and k in b[s]]
    if not pairs or set(a) != set(b):
        return False, f"logged steps differ: {sorted(a)} against {sorted(b)}"
    differ = [(s, k, a[s][k], b[s][k]) for s, k in pairs if a[s][k] != b[s][k]]
    at = summary["resumed_from_step"]
    head = (
        f"resumed run (from step {at}) against the uninterrupted run: {len(pairs)} figures over "
        f"{len(steps)} logged steps ({steps[0]}..{steps[-1]})"
    )
    if differ:
        worst = max(abs(x - y) for _, _, x, y in differ)
        first = ", ".join(f"step {s} {k} {x!r} != {y!r}" for s, k, x, y in differ[:3])
        return False, f"{head}: {len(differ)} differ (largest {worst:.3g}): {first}"
    return True, f"{head}: all bitwise equal"


def cli_rate(log: Path, seq: int | None) -> float | None:
    """The rate of the last progress line the CLI printed in ``log``, in examples a second
    (a language model's line shows tokens a second: ``seq`` of them to an example)."""
    found = PROGRESS.findall(log.read_text(errors="replace")) if log.is_file() else []
    if not found:
        return None
    rate, unit = float(found[-1][2].replace(",", "")), found[-1][3]
    return rate if unit == "ex" else rate / seq if seq else None


def row(step: dict, logs: Path) -> dict:
    out = {k: step[k] for k in ("step", "status", "exit", "seconds")}
    run = Path(step["run"]) if step["run"] not in ("", "-") else None
    log = logs / f"{step['step']}.log"
    if run is None:
        return out
    recipe = json.loads((run / "recipe.json").read_text()) if (run / "recipe.json").is_file() else {}
    seq = recipe.get("data", {}).get("seq_len")
    out["ex_per_s"] = cli_rate(log, seq)
    stopped = INTERRUPTED.search(log.read_text(errors="replace")) if log.is_file() else None
    finished = (run / "summary.json").is_file() and stopped is None
    summary = json.loads((run / "summary.json").read_text()) if finished else {}
    rate = summary.get("examples_per_sec") or out["ex_per_s"]
    out["tokens_per_s"] = round(rate * seq) if rate and seq else None
    out["mfu"] = next(
        (v for k, v in summary.items() if "mfu" in k.lower() and isinstance(v, (int, float))), None
    )
    last = records(run) if (run / "metrics.jsonl").is_file() else {}
    if stopped:  # the run went on after this step: its figures up to the interrupt
        last = {k: v for k, v in last.items() if k <= int(stopped.group(1))}
    losses = [r for _, r in sorted(last.items()) if "loss" in r]
    evals = [r for _, r in sorted(last.items()) if "eval_loss" in r]
    out["loss"] = summary.get("train_loss", losses[-1]["loss"] if losses else None)
    out["eval_loss"] = evals[-1]["eval_loss"] if evals else None
    out["model"] = recipe.get("model", {}).get("preset")
    for key in ("trainable_params", "remat", "offload", "update_on", "attention", "epsilon"):
        if key in summary:
            out[key] = summary[key]
    return out


def fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def table(steps_tsv: Path, logs: Path, out: Path, budget: float | None, started: float | None) -> None:
    with steps_tsv.open() as f:
        steps = list(csv.DictReader(f, delimiter="\t"))
    rows = [row(s, logs) for s in steps]
    columns = [
        "step",
        "status",
        "exit",
        "seconds",
        "model",
        "ex_per_s",
        "tokens_per_s",
        "mfu",
        "loss",
        "eval_loss",
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    failed = [r["step"] for r in rows if r["status"] not in ("ok",) and not r["status"].startswith("skipped")]
    took = time.time() - started if started else None
    notes = [
        f"{len(rows)} steps: {sum(r['status'] == 'ok' for r in rows)} ok, "
        f"{sum(r['status'].startswith('skipped') for r in rows)} skipped, {len(failed)} failed"
        + (f" ({', '.join(failed)})" if failed else ""),
        "ex_per_s: the rate of the CLI's last progress line (padded rows under DP); tokens_per_s: "
        "the summary's examples_per_sec (else that rate) times data.seq_len; mfu: the summary's, "
        "where the CLI reports one",
    ]
    harness = harness_ratio(rows, logs / "harness_gpt2.json")
    if harness:
        notes.append(harness["note"])
    if took is not None:
        notes.append(f"{took:.0f} s in all" + (f", of a budget of {budget:.0f} s" if budget else ""))
    text = "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    print(text)
    (out / "session.md").write_text(text)
    (out / "session.json").write_text(
        json.dumps({"rows": rows, "notes": notes, "harness": harness}, indent=2) + "\n"
    )


def harness_ratio(rows: list[dict], path: Path) -> dict | None:
    """The uninterrupted GPT-2 run's tokens/s (the CLI's, from its summary: eval and checkpoint
    time left out, as the progress bar's rate) over the harness's zoo step at the same shape
    (``mfu.py``'s ``zoo:`` row), with the fastest plain-JAX row beside it."""
    twin = next((r for r in rows if r["step"] == "gpt2_twin" and r.get("tokens_per_s")), None)
    if twin is None or not path.is_file():
        return None
    found = json.loads(path.read_text()).get("rows", [])
    zoo_row = next((r for r in found if r["row"].startswith("zoo:")), None)
    plains = [r for r in found if r["row"].startswith("plain:")]
    plain = max(plains, key=lambda r: r["tokens_per_s"], default=None)  # the fastest plain row
    if zoo_row is None:
        return None
    ratio = twin["tokens_per_s"] / zoo_row["tokens_per_s"]
    note = (
        f"the CLI's tokens/s over the harness's at the same shape and policy: {ratio:.3f} "
        f"(gpt2_twin {twin['tokens_per_s']:,.0f}, harness {zoo_row['row']} {zoo_row['tokens_per_s']:,.0f}"
        + (f", plain-JAX {plain['row']} {plain['tokens_per_s']:,.0f}" if plain else "")
        + " tokens/s)"
    )
    return {"ratio": ratio, "cli": twin["tokens_per_s"], "zoo": zoo_row, "plain": plain, "note": note}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("same-losses")
    s.add_argument("resumed", type=Path)
    s.add_argument("twin", type=Path)
    t = sub.add_parser("table")
    t.add_argument("steps", type=Path)
    t.add_argument("--logs", type=Path, required=True, help="the folder of the steps' logs")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--budget", type=float)
    t.add_argument("--started", type=float)
    args = p.parse_args(argv)
    if args.what == "same-losses":
        ok, text = same_losses(args.resumed, args.twin)
        print(f"session_report: {text}")
        return 0 if ok else 1
    table(args.steps, args.logs, args.out, args.budget, args.started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
