"""TensorBoard event files, written with TensorBoard's own record writer and protos (no
TensorFlow): scalars as ``simple_value`` summaries, text as the text plugin's string tensors.

One writer per run directory: opening one removes the event files already there (a resumed
run writes its kept records again, so that each step appears once), never the profile traces
under ``plugins/``.

The records go through a buffered file on the caller's thread, flushed every
:data:`FLUSH_SECS` and on close. TensorBoard's ``EventFileWriter`` hands each record to a thread
of its own; on a 2-core machine that thread and a dispatch-bound training loop take turns at the
interpreter lock, and digits-mlp ran at 0.87 of its speed with it against 0.97 without it
(benchmarks/train/RESULTS.md, "What the event writer costs").
"""

from __future__ import annotations

import numbers
import os
import socket
import time
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

EVENTS_GLOB = "events.out.tfevents.*"
FLUSH_SECS = 10  # a run in progress shows a record at most this many seconds after the next one is written


class EventWriter:
    """Scalars and text into ``logdir`` (``RUN/tb``)."""

    def __init__(self, logdir: Path) -> None:
        logdir.mkdir(parents=True, exist_ok=True)
        for old in logdir.glob(EVENTS_GLOB):
            old.unlink()
        # TensorBoard's name for an event file: events.out.tfevents.<time>.<host>.<pid>.<n>
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.0"
        self._file = open(logdir / name, "wb")  # noqa: SIM115 (closed by close())
        self._records = RecordWriter(self._file)
        self._flushed = time.monotonic()
        version = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
        self._records.write(version.SerializeToString())

    def scalars(self, record: dict, skip: tuple[str, ...] = (), wall_time: float | None = None) -> None:
        """One scalar per number of ``record`` at ``record["step"]``, but the keys in ``skip``."""
        values = [
            summary_pb2.Summary.Value(tag=key, simple_value=float(value))
            for key, value in record.items()
            if key not in skip and isinstance(value, numbers.Real) and not isinstance(value, bool)
        ]
        if values:
            self._add(summary_pb2.Summary(value=values), int(record["step"]), wall_time)

    def text(self, tag: str, markdown: str, step: int = 0) -> None:
        """``markdown`` under ``tag`` in the text dashboard."""
        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text")
        )
        tensor = tensor_pb2.TensorProto(
            dtype=types_pb2.DT_STRING,
            string_val=[markdown.encode()],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(),
        )
        value = summary_pb2.Summary.Value(tag=tag, metadata=metadata, tensor=tensor)
        self._add(summary_pb2.Summary(value=[value]), step, None)

    def _add(self, summary, step: int, wall_time: float | None) -> None:
        wall = time.time() if wall_time is None else wall_time
        self._records.write(event_pb2.Event(wall_time=wall, step=step, summary=summary).SerializeToString())
        if time.monotonic() - self._flushed > FLUSH_SECS:
            self._file.flush()
            self._flushed = time.monotonic()

    def close(self) -> None:
        self._file.close()  # flushes
