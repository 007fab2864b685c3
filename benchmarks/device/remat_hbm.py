"""Remat policies on the chip: ms/step and the HBM peak of each, one process per policy.

    python benchmarks/device/remat_hbm.py                      # GPT-2 124M, T 1024, batch 8
    python benchmarks/device/remat_hbm.py --policies none,full --batch 16

``memory_stats()``'s peak never goes down within a process, and one chip cannot be shared by
two processes, so each policy runs ``mfu.py`` (zoo's step alone, splash attention) in a child
process of its own, one after another; the peak is that process's, the weights and the
optimizer state included. The table gives each policy's time over ``none``'s (where ``none``
ran) and its peak beside ``full``'s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
POLICIES = "none,dots,minimal,full,offload-layer-input"


def one(policy: str, args) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, str(HERE / "mfu.py"), "--plain", "", "--zoo", f"{args.attention}:{policy}"]
        cmd += [
            "--batch",
            str(args.batch),
            "--rounds",
            str(args.rounds),
            "--json",
            out.name,
            "--preset",
            args.preset,
        ]
        cmd += ["--small"] if args.small else []
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["?"])[-1]
            return {"policy": policy, "error": last[:200]}
        result = json.loads(Path(out.name).read_text())
    row = result["rows"][0]
    return {"policy": policy, **row, "hbm_peak_gib": result.get("hbm_peak_gib")}


def table(rows: list[dict]) -> str:
    by = {r["policy"]: r for r in rows}
    none, full = by.get("none", {}), by.get("full", {})
    lines = [
        "| policy | ms/step | MFU | x none | HBM peak GiB | peak - full's GiB | temp MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['policy']} | failed: {r['error']} | | | | | |")
            continue
        ratio = f"{r['ms'] / none['ms']:.2f}" if "ms" in none else "n/a"
        peak = r.get("hbm_peak_gib")
        delta = (
            f"{peak - full['hbm_peak_gib']:+.2f}" if peak is not None and full.get("hbm_peak_gib") else "n/a"
        )
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a"
        peak_text = f"{peak:.2f}" if peak is not None else "n/a"
        lines.append(
            f"| {r['policy']} | {r['ms']:.2f} | {mfu} | {ratio} | {peak_text} | {delta} | {r['temp_mib']:,.0f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="gpt2-124m")
    parser.add_argument("--policies", default=POLICIES)
    parser.add_argument("--attention", default="splash")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=240, help="seconds per policy's process")
    parser.add_argument("--json", default="")
    parser.add_argument("--small", action="store_true", help="a CPU: mfu.py's tiny model")
    args = parser.parse_args(argv)
    rows = []
    for policy in args.policies.split(","):
        rows.append(one(policy, args))
        print(f"remat_hbm: {policy} done", file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
