"""``zoo.parallel.distributed``: gloo's rendezvous lines, which its C++ writes to stdout, are
left out of a run's stdout; the run's own lines pass whole and in order."""

from __future__ import annotations

import subprocess
import sys

from zoo.parallel.distributed import gloo_chatter

GLOO = b"[Gloo] Rank 1 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7\n"


def test_gloo_lines_even_mixed_are_chatter_and_the_runs_lines_are_not():
    mixed = b"[Gloo] Rank [Gloo] Rank 23 is connected to 3 peer ranks. Expected number of connected peer ranks is : \n"
    assert gloo_chatter(GLOO) and gloo_chatter(mixed) and gloo_chatter(b"3\n")
    for line in (b"\n", b'{"loss": 1}\n', b"trainable 26,122  frozen 0\n", b"rank 3 of 7\n"):
        assert not gloo_chatter(line), line


def test_stdout_written_below_python_loses_only_gloos_lines():
    child = f"""
import os
from zoo.parallel.distributed import drop_stdout_lines, gloo_chatter
print("before", flush=True)
drop_stdout_lines(gloo_chatter)
print("a table line")
os.write(1, {GLOO!r} * 3 + b"kept from C\\n")  # as C++ writes: below sys.stdout
print('{{"summary": 1}}', end="")
"""
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().splitlines() == ["before", "a table line", "kept from C", '{"summary": 1}']


def test_joining_a_cluster_filters_stdout_and_one_process_does_not(monkeypatch):
    import jax

    from zoo.parallel import distributed

    installed = []
    monkeypatch.setattr(distributed, "drop_stdout_lines", installed.append)
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: None)
    monkeypatch.setattr(jax.config, "update", lambda *args: None)
    distributed.initialize(None)
    assert installed == []
    distributed.initialize(distributed.Cluster("127.0.0.1:7777", 2, 1))
    assert installed == [distributed.gloo_chatter]
