"""Loading ``hf:NAME[:CONFIG]`` from the Hugging Face Hub, failing fast when it is out of reach."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

import datasets
from datasets.exceptions import DatasetNotFoundError

from zoo.data.errors import DatasetError
from zoo.data.table import offline_forms

PROBE_TIMEOUT_S = 2.0
_TRUE = {"1", "ON", "YES", "TRUE"}
_NETWORK_HINTS = ("Connect", "Timeout", "Offline", "Network", "ProxyError")


def offline_flag() -> str | None:
    """``"VAR=value"`` for the first of HF_HUB_OFFLINE / HF_DATASETS_OFFLINE that is set true."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        value = os.environ.get(var, "")
        if value.strip().upper() in _TRUE:
            return f"{var}={value}"
    return None


def _probe_target() -> tuple[str, int]:
    """Host and port a Hub request would first connect to (the HTTPS proxy if one is set)."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urlparse(proxy or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    default_port = 443 if url.scheme == "https" else 80
    return url.hostname or "huggingface.co", url.port or default_port


def unreachable_reason(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None if a TCP connection to the Hub opens within ``timeout_s``, else why not.

    The probe runs in a daemon thread so that a slow DNS lookup cannot stall the caller.
    """
    host, port = _probe_target()
    outcome: dict[str, object] = {}

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            outcome["ok"] = True
        except OSError as e:
            outcome["error"] = e

    thread = threading.Thread(target=probe, daemon=True, name="zoo-hub-probe")
    thread.start()
    thread.join(timeout_s + 0.5)
    if outcome.get("ok"):
        return None
    return f"cannot connect to {host}:{port} ({outcome.get('error') or 'timed out'})"


def offline_error(spec: str, reason: str) -> DatasetError:
    return DatasetError(
        f"cannot load {spec!r}: the Hugging Face Hub is not reachable ({reason}). "
        f"Offline alternatives: {', '.join(offline_forms())}."
    )


def _is_network_error(error: BaseException) -> bool:
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, (ConnectionError, TimeoutError, socket.timeout)):
            return True
        if any(h in type(seen).__name__ for h in _NETWORK_HINTS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def load_hub(spec: str, name: str, config: str | None) -> datasets.DatasetDict | datasets.Dataset:
    """``datasets.load_dataset(name, config)``, or a DatasetError within a few seconds if offline.

    With HF_HUB_OFFLINE set before `datasets` was imported, `datasets` itself runs offline and may
    serve a cached copy; if the flag was set later, `datasets` would still try the network, so we
    refuse straight away. Without the flag, a short TCP probe checks the Hub first. A local
    dataset folder (``name`` a directory, as ``zoo tokenize hf:DIR`` reads it) needs no Hub: it
    is loaded without either.
    """
    if Path(name).expanduser().is_dir():
        return _load(spec, str(Path(name).expanduser()), config)
    flag = offline_flag()
    if flag and not datasets.config.HF_HUB_OFFLINE:
        raise offline_error(spec, f"{flag}")
    if not flag:
        reason = unreachable_reason()
        if reason:
            raise offline_error(spec, f"{reason}; export HF_HUB_OFFLINE=1 to use a cached copy")
    return _load(spec, name, config)


def _load(spec: str, name: str, config: str | None) -> datasets.DatasetDict | datasets.Dataset:
    try:
        return datasets.load_dataset(name, config)
    except DatasetNotFoundError as e:
        raise DatasetError(
            f"cannot load {spec!r}: {name!r} was not found on the Hub or in the cache ({e})"
        ) from None
    except Exception as e:
        if _is_network_error(e):
            raise offline_error(spec, f"{type(e).__name__}: {e}") from None
        raise DatasetError(f"cannot load {spec!r}: {type(e).__name__}: {e}") from e
