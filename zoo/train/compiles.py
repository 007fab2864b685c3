"""Count XLA compilations with a ``jax.monitoring`` listener."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
    """Counts backend compiles that happen inside ``with counter.track():`` blocks."""

    def __init__(self) -> None:
        self.count = 0
        self._active = False

    def _listener(self, event: str, duration: float, **_) -> None:
        if self._active and event == COMPILE_EVENT:
            self.count += 1

    @contextlib.contextmanager
    def track(self) -> Iterator[CompileCounter]:
        self._active = True
        try:
            yield self
        finally:
            self._active = False

    def __enter__(self) -> CompileCounter:
        jax.monitoring.register_event_duration_secs_listener(self._listener)
        return self

    def __exit__(self, *exc) -> None:
        jax.monitoring.unregister_event_duration_listener(self._listener)
