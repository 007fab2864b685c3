"""``zoo tokenize`` throughput (tokens/s) and peak RSS, with the byte vocabulary and with
Hugging Face BPE tokenizers.

    .venv/bin/python benchmarks/data/tokenize_speed.py --mb 200 --bpe-mb 20 --large-mb 2000

Corpora from ``corpus.py`` under ``--root`` (not committed); the byte vocabulary on ``--mb``
MB, the BPE tokenizers on ``--bpe-mb`` MB (they run at about 1 MB/s on two shared cores). Each row is a fresh interpreter
running ``zoo tokenize SRC --out DIR --vocabulary V``: its wall time from the call to the
store renamed into place, the tokens written, and the process's peak RSS (``VmHWM``). The BPE
rows use the 64-id test fixture (``tests/fixtures/hf/llama3-tied``) and a 32,000-token
byte-level BPE trained here with ``tokenizers`` on the first 20 files of the corpus (the
corpus is CPython's own documentation, so the vocabulary is public). ``--large-mb`` adds the
byte vocabulary on the large corpus (the peak RSS the issue asks for there), and
``--large-bpe`` the 32k BPE on it too (slow on two cores).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import corpus

FIXTURE = Path("tests/fixtures/hf/llama3-tied/tokenizer.json")

CHILD = """
import json, sys, time
from zoo.cli import main
tic = time.perf_counter()
code = main(["tokenize", *sys.argv[1:], "--no-progress", "--json"])
seconds = time.perf_counter() - tic
peak = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(json.dumps({"code": code, "seconds": seconds, "peak_rss_mb": peak / 1024}))
"""


LIBRARY = """
import json, sys, time
from pathlib import Path
from tokenizers import Tokenizer
from zoo.data.tokens.documents import cut
tok = Tokenizer.from_file(sys.argv[1])
tic, tokens, parts = time.perf_counter(), 0, []
for path in sorted(Path(sys.argv[2]).glob("*.txt")):
    parts += cut(path.read_text(encoding="utf-8"), 1 << 16)
    if len(parts) >= 16 or path == sorted(Path(sys.argv[2]).glob("*.txt"))[-1]:
        tokens += sum(len(e.ids) for e in tok.encode_batch_fast(parts, add_special_tokens=False))
        parts = []
seconds = time.perf_counter() - tic
print(json.dumps({"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "peak_rss_mb": 0}))
"""


def library(tokenizer: Path, folder: Path) -> dict:
    """The tokenizers library alone on the same text, in the same parts and batches: the
    ceiling of ``zoo tokenize`` with that tokenizer."""
    done = subprocess.run(
        [sys.executable, "-c", LIBRARY, str(tokenizer), str(folder)], capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def train_bpe(files: list[Path], out: Path, size: int = 32_000) -> Path:
    """A byte-level BPE of ``size`` tokens trained on ``files`` (written once)."""
    if out.exists():
        return out
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(f) for f in files], trainer)
    tok.save(str(out))
    return out


def row(source: str, vocabulary: str, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, source, "--out", str(out), "--vocabulary", vocabulary],
        capture_output=True,
        text=True,
    )
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    lines = done.stdout.strip().splitlines()
    meta, timing = json.loads(lines[-2]), json.loads(lines[-1])
    tokens = sum(s["tokens"] for s in meta["splits"].values())
    return {"tokens": tokens, **timing, "tokens_per_s": tokens / timing["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200, help="corpus size (MB) of the byte vocabulary")
    parser.add_argument("--bpe-mb", type=float, default=20, help="corpus size (MB) of the BPE tokenizers")
    parser.add_argument("--large-mb", type=float, default=0, help="also the byte vocabulary on this size")
    parser.add_argument("--large-bpe", action="store_true", help="and the 32k BPE on the large corpus")
    parser.add_argument("--root", default="/tmp/zoo-data-bench")
    args = parser.parse_args()
    root = Path(args.root)
    corpus.make(root / f"corpus-{args.mb:g}mb", args.mb)
    files = corpus.make(root / f"corpus-{args.bpe_mb:g}mb", args.bpe_mb)
    bpe = train_bpe(files[:20], root / "bpe32k.json")
    runs = [(args.mb, "bytes"), (args.bpe_mb, f"hf:{FIXTURE}"), (args.bpe_mb, f"hf:{bpe}")]
    if args.large_mb:
        corpus.make(root / f"corpus-{args.large_mb:g}mb", args.large_mb)
        runs.append((args.large_mb, "bytes"))
        if args.large_bpe:
            runs.append((args.large_mb, f"hf:{bpe}"))
    results = []
    for mb, vocabulary in runs:
        result = row(f"text:{root / f'corpus-{mb:g}mb'}", vocabulary, root / "tokenized")
        results.append((mb, vocabulary, result))
        print(json.dumps({"mb": mb, "vocabulary": vocabulary, **result}), flush=True)
        if vocabulary.startswith("hf:"):  # the library alone, right after, on the same text
            alone = library(Path(vocabulary[3:]), root / f"corpus-{mb:g}mb")
            results.append((mb, f"(tokenizers alone) {Path(vocabulary[3:]).name}", alone))
    print(
        f"\n{'corpus MB':>9} {'vocabulary':<44} {'tokens':>14} {'seconds':>8} {'tokens/s':>12} {'MB/s':>6} {'peak RSS MB':>11}"
    )
    for mb, vocabulary, r in results:
        print(
            f"{mb:>9,.0f} {vocabulary[-44:]:<44} {r['tokens']:>14,} {r['seconds']:>8.1f} "
            f"{r['tokens_per_s']:>12,.0f} {mb / r['seconds']:>6.1f} {r['peak_rss_mb']:>11,.0f}"
        )


if __name__ == "__main__":
    main()
