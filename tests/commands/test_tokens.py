"""``zoo.commands.tokens``: what the progress bar shows of how much was read, and when it starts."""

from __future__ import annotations

from zoo.commands.tokens import _read


def test_a_small_file_reads_in_kilobytes_not_zero_megabytes():
    assert _read("bytes", 45_809, 45_809) == "45.8/45.8 kB"
    assert _read("bytes", 2_500_000, 5_000_000) == "2.5/5.0 MB"
    assert _read("rows", 3, None) == "3 rows"


def test_an_unreadable_vocabulary_or_source_is_one_line_with_no_empty_bar(tmp_path):
    """The bar drew itself, empty ("0 tokens"), above the refusal of a tokenizer file that
    cannot be read; it starts with the first progress report now. A readable one still shows it."""
    import subprocess
    import sys

    (tmp_path / "a.txt").write_text("def main():\n    return 0\n" * 50)
    zoo = [
        sys.executable,
        "-c",
        "import sys; from zoo.cli import main; sys.exit(main(sys.argv[1:]))",
        "tokenize",
    ]

    def run(src: str, vocabulary: str) -> subprocess.CompletedProcess:
        out = tmp_path / f"out-{vocabulary.replace('/', '_')}-{src[-5:]}"
        cmd = [*zoo, src, "--out", str(out), "--vocabulary", vocabulary]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    for src, vocabulary, said in (
        (f"text:{tmp_path}", f"hf:{tmp_path / 'none.json'}", "cannot read the tokenizer"),
        (f"text:{tmp_path / 'gone'}", "bytes", "file not found"),
    ):
        done = run(src, vocabulary)
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0 and len(lines) == 1 and said in lines[0], done.stderr
    done = run(f"text:{tmp_path}", "bytes")
    assert done.returncode == 0 and "tokenize" in done.stderr and "tokens/s" in done.stderr, done.stderr
