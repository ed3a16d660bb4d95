"""The collector's temporary export folders in the store: made, found stale, removed on SIGTERM.

Without ``trace_dir`` a trace is exported into ``<store>/.stepscope-export-<host>-<pid>-<random>``
(``<host>`` names the host and its pid namespace)
(inside the store, so a full disk shows up as what it is) and the folder is removed once the
trace is ingested. A job killed by SIGTERM (a scheduler's time limit, torchrun stopping its
workers) used to leave its folders, traces inside, in the store. Now a SIGTERM handler removes
them before the process dies as it would have, and the next start of profiling on the same store
removes any left by processes that no longer run (a ``kill -9``): folders of this host and pid
namespace whose process is gone, and any folder untouched for ``STALE_S``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("stepscope.collector")

PREFIX = ".stepscope-export-"
STALE_S = 24 * 3600.0
"""A folder untouched this long is stale whichever host made it (a conversion is bounded by
the sink's ``convert_timeout_s``, an hour by default)."""


def _pid_namespace() -> str:
    """Which process-id space a pid belongs to: containers on one host (even sharing its name)
    each have their own, and a pid means nothing outside it. Empty where /proc has no answer."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


_HOST = "_".join(p for p in (re.sub(r"[^A-Za-z0-9.]+", "_", socket.gethostname()) or "host",
                             _pid_namespace()) if p)
"""This host and pid namespace, as written into folder names: a pid is checked only here."""
_NAME = re.compile(rf"^{re.escape(PREFIX)}(?P<host>[A-Za-z0-9._]+)-(?P<pid>\d+)-")

_lock = threading.Lock()
_live: set[Path] = set()
_previous_handler: Any = None
_installed = False


def make_export_folder(store: Path) -> Path:
    """A fresh folder in ``store`` for one export, removed on SIGTERM until
    ``remove_export_folder``."""
    store.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{_HOST}-{os.getpid()}-", dir=store))
    with _lock:
        _live.add(folder)
    return folder


def remove_export_folder(folder: Path) -> None:
    """Remove an export folder once its trace is converted (or dropped)."""
    with _lock:
        _live.discard(folder)
    shutil.rmtree(folder, ignore_errors=True)


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists but belongs to someone else
        return False
    return False


def is_stale(folder: Path, now: float | None = None) -> bool:
    """Whether ``folder`` (an export folder) was left by a process that no longer runs."""
    match = _NAME.match(folder.name)
    if match and match["host"] == _HOST and int(match["pid"]) != os.getpid() and _process_gone(int(match["pid"])):
        return True
    try:
        return folder.stat().st_mtime < (time.time() if now is None else now) - STALE_S
    except OSError:
        return False


def remove_stale(store: Path) -> None:
    """Remove the export folders in ``store`` left behind by processes that died. Best effort:
    a store that cannot be listed or written is reported by the first write, not here."""
    try:
        folders = [p for p in store.glob(f"{PREFIX}*") if p.is_dir()]
    except OSError:
        return
    for folder in folders:
        if is_stale(folder):
            log.debug("stepscope: removing %s, left by a process that no longer runs", folder)
            shutil.rmtree(folder, ignore_errors=True)


def _on_sigterm(signum: int, frame: Any) -> None:
    with _lock:
        folders = list(_live)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    previous = _previous_handler
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        # The default action (or a handler set outside Python): die of the signal, as without us.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def clean_up_on_sigterm() -> None:
    """Install the SIGTERM handler that removes live export folders, chained to the one before
    it. Only from the main thread (the only one Python lets set handlers); once per process."""
    global _installed, _previous_handler
    if _installed or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        return
    _previous_handler = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _on_sigterm)
    _installed = True
