"""TensorBoard event files, written with TensorBoard's own event writer and protos (no
TensorFlow): scalars as ``simple_value`` summaries, text as the text plugin's string tensors.

One writer per run directory: opening one removes the event files already there (a resumed
run writes its kept records again, so that each step appears once), never the profile traces
under ``plugins/``.
"""

from __future__ import annotations

import numbers
import time
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

EVENTS_GLOB = "events.out.tfevents.*"
FLUSH_SECS = 10  # a run in progress shows its newest points within this many seconds


class EventWriter:
    """Scalars and text into ``logdir`` (``RUN/tb``)."""

    def __init__(self, logdir: Path) -> None:
        logdir.mkdir(parents=True, exist_ok=True)
        for old in logdir.glob(EVENTS_GLOB):
            old.unlink()
        self._writer = EventFileWriter(str(logdir), flush_secs=FLUSH_SECS)

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
        self._writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary))

    def close(self) -> None:
        self._writer.close()  # flushes
