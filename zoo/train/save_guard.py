"""The edges of a checkpoint write: Ctrl-C waits for it, and a write that fails (a full disk, a
file-size limit) is one line naming the folder and the cause.

orbax writes a step from several threads, each on an asyncio loop of its own. When one write
fails, the save raises while the others are still running: they report into the terminal as
they end (absl ``ERROR`` lines, "Event loop is closed" from tensorstore's callbacks), and the
coroutines they leave behind report again as the interpreter exits ("sys.meta_path is None").
:func:`held_reports` keeps those reports while a save runs; when the save fails it waits for the
save's threads to end and collects what they left, then drops the reports, which only repeat
the one failure the error line names. A save that succeeds gets its reports back, unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import os
import re
import signal
import sys
import threading
import time
import traceback
import warnings

from zoo.errors import ZooError

SETTLE_S = 30.0  # the longest a failed save waits for its other writes to end
_OS_CODE = re.compile(r"os_error_code='?(\d+)|\(os error (\d+)\)")  # tensorstore's; Rust's (safetensors)
_HINTS = {errno.EFBIG: "a file-size limit (ulimit -f) was reached", errno.ENOSPC: "the disk is full"}
OUT_OF_ROOM = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class RunWriteError(ZooError):
    """A file of the run could not be written (a full disk, a file-size limit); what was written
    before it is intact, so the run stops and says how to continue once there is room."""


class CheckpointWriteError(RunWriteError):
    """A checkpoint step could not be written; nothing of it is left on disk."""


@contextlib.contextmanager
def finish_before_interrupt():
    """Ctrl-C inside the block is held until the block ends, then raised: a checkpoint write
    runs to its end (orbax's threads, stopped midway, print errors as the interpreter exits).
    Only in the main thread, and only while SIGINT raises KeyboardInterrupt as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    held: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if held:
        raise KeyboardInterrupt


def out_of_room(error: BaseException) -> str | None:
    """:func:`os_cause` of ``error`` where it is a full disk, a file-size limit or a quota, else
    None (an error of another kind is not this module's to word)."""
    return os_cause(error) if _os_code(error) in OUT_OF_ROOM else None


def os_cause(error: BaseException) -> str | None:
    """The operating system's reason in ``error`` ("File too large: a file-size limit (ulimit -f)
    was reached"), read from an ``OSError`` or from tensorstore's ``os_error_code`` in orbax's
    message; None when the error carries none (a bug, not the disk)."""
    code = _os_code(error)
    if code is None:
        return None
    hint = _HINTS.get(code)
    return os.strerror(code) + (f": {hint}" if hint else "")


def _os_code(error: BaseException) -> int | None:
    """The errno an ``OSError`` carries, or one named in the message (tensorstore's, Rust's)."""
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno
    found = _OS_CODE.search(str(error))
    return int(found.group(1) or found.group(2)) if found else None


LOGGERS = ("absl", "asyncio")  # orbax's threads log through absl; asyncio, on the futures they drop
_FAILED: set[str] = set()  # the temporary folders of failed saves, named in their late reports


class _Held(logging.Filter):
    """Keeps the records of a logger instead of letting them through."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False


@contextlib.contextmanager
def held_reports(folder: str):
    """Keep the reports of a save's threads (module docstring) for the block: given back when
    it succeeds; when it raises, dropped once the threads it started have ended, and from then
    on the late reports of its writes too (those that name ``folder``, the save's temporary
    folder, or come from a loop or a coroutine orbax left)."""
    before = set(threading.enumerate())
    held, loggers = _Held(), [logging.getLogger(name) for name in LOGGERS]
    hook, unraisable = sys.unraisablehook, []
    # The message and the error only: keeping the hook's argument could revive a finalized object.
    sys.unraisablehook = lambda u: unraisable.append((u.err_msg or "Exception ignored", u.exc_value))
    for logger in loggers:
        logger.addFilter(held)
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        _settle(before)
        raise
    finally:
        for logger in loggers:
            logger.removeFilter(held)
        sys.unraisablehook = hook
        if failed:
            _drop_late_reports(folder)
        else:
            for message, error in unraisable:  # as Python reports them, less the object's repr
                print(message, file=sys.stderr)
                traceback.print_exception(error, file=sys.stderr)
            for record in held.records:
                logging.getLogger(record.name).handle(record)


def _settle(before: set[threading.Thread]) -> None:
    """Wait (at most :data:`SETTLE_S`) for the threads started since ``before``, those started
    meanwhile included, to end; then collect the coroutines they left, so that they end now and
    not as the interpreter exits."""
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        running = [
            t for t in threading.enumerate() if t not in before and t is not threading.current_thread()
        ]
        if not running:
            break
        for thread in running:  # Thread.join itself: orbax's threads raise their error from join()
            threading.Thread.join(thread, max(0.0, deadline - time.monotonic()))
    gc.collect()


def _drop_late_reports(folder: str) -> None:
    """From now on, drop the reports that tensorstore's writes of a failed save make as they
    end, after the save has raised: they run in its C++ threads, which :func:`_settle` cannot
    wait for. Every other report goes through as before."""
    _FAILED.add(folder)
    # A coroutine of the failed writes that was never awaited is reported by the warnings
    # module as it is collected (at the interpreter's exit under load, "sys:1: RuntimeWarning:
    # coroutine 'async_serialize_from_host.<locals>.write_fragment' was never awaited").
    warnings.filterwarnings("ignore", message=r"coroutine '.*' was never awaited", category=RuntimeWarning)
    if not isinstance(sys.unraisablehook, _LateReports):
        sys.unraisablehook = _LateReports(sys.unraisablehook)
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _keep_record not in logger.filters:
            logger.addFilter(_keep_record)


def _names_a_failed_save(text: str) -> bool:
    return any(folder in text for folder in _FAILED)


def _keep_record(record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return not _names_a_failed_save(record.getMessage() + (str(error) if error else ""))


class _LateReports:
    """``sys.unraisablehook`` after a failed save: the reports of its writes are dropped
    (tensorstore's callbacks into an event loop orbax closed, the coroutines orbax left, an
    error naming the save's folder); any other goes to the hook it wraps."""

    def __init__(self, hook) -> None:
        self.hook = hook

    def __call__(self, unraisable) -> None:
        error, code = unraisable.exc_value, getattr(unraisable.object, "cr_code", None)
        late = _names_a_failed_save(str(error))
        late = late or (isinstance(error, RuntimeError) and str(error) == "Event loop is closed")
        late = late or (code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename)
        if not late:
            self.hook(unraisable)
