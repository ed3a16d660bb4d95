"""``stepscope dashboard``: serve the Streamlit dashboard on a store, bound to 127.0.0.1 by default.

Runs ``python -m stepscope.dashboard.server run stepscope/dashboard/app.py`` (Streamlit's ``streamlit run``,
with the pages' imports begun while it starts: :mod:`stepscope.dashboard.server`) in a child process (Streamlit owns
its event loop and signal handling) and prints the URL. The store path is handed to the app on
its command line, never through the URL.

The command is the child's supervisor: SIGTERM, SIGINT and SIGHUP sent to it (``kill <pid>``,
Ctrl-C, a closed terminal) are forwarded to Streamlit, which is waited for (and killed if it has
not stopped within :data:`STOP_GRACE_S`), so stopping the command frees the port. On Linux the
child also gets SIGTERM when the command dies without a chance to forward (``kill -9``).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from stepscope.errors import UsageError
from stepscope.store.location import is_url, store_files, store_location

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
DEFAULT_PORT = 8501
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STOP_GRACE_S = 10.0
"""How long Streamlit may take to stop after a forwarded signal before it is killed."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", type=store_location, required=True, help="store folder or URL (s3://bucket/prefix)")
    add_server_arguments(parser)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """``--port`` and ``--host``: shared with ``stepscope demo``."""
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 shares it)")


def _shown(store: Path | str) -> str:
    """The store as the app is given it: a URL as it is, a folder made absolute."""
    return store if is_url(store) else str(Path(store).resolve())


def command(store: Path | str, host: str, port: int) -> list[str]:
    """The ``streamlit run`` command line for ``store``."""
    return [
        sys.executable, "-m", "stepscope.dashboard.server", "run", str(APP),
        "--server.address", host, "--server.port", str(port), "--server.headless", "true",
        "--browser.gatherUsageStats", "false", "--server.runOnSave", "false",
        "--runner.magicEnabled", "false", "--client.toolbarMode", "minimal",
        "--", "--store", _shown(store),
    ]


def url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{shown}:{port}/"


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux for SIGTERM when the parent dies (``PR_SET_PDEATHSIG``)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def supervise(process: subprocess.Popen[bytes]) -> int:
    """Wait for ``process``, forwarding :data:`FORWARDED_SIGNALS` to it; returns its exit status
    (128 + N when a signal N ended it, as a shell reports it)."""
    stop_by: list[float] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if process.poll() is None:
            process.send_signal(signum)
            stop_by.append(time.monotonic() + STOP_GRACE_S)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        while True:
            try:
                code = process.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if stop_by and time.monotonic() > stop_by[0]:
                    process.kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if process.poll() is None:
            process.kill()
            process.wait()
    return 128 - code if code < 0 else code


def serve(store: Path | str, host: str, port: int) -> int:
    """Start the server and wait for it; SIGTERM, SIGINT (Ctrl-C) and SIGHUP stop it."""
    try:
        import streamlit  # noqa: F401  (only to say clearly when the extra is missing)
    except ImportError as exc:
        raise UsageError("the dashboard needs streamlit and altair: pip install 'stepscope[dashboard]'") from exc
    if not 0 < port < 65536:
        raise UsageError(f"--port {port}: not a port number")
    print(f"stepscope dashboard on {_shown(store)}: {url(host, port)}  (Ctrl-C stops it)", flush=True)
    linux = sys.platform.startswith("linux")
    return supervise(subprocess.Popen(command(store, host, port), preexec_fn=_die_with_parent if linux else None))


def run(args: argparse.Namespace) -> int:
    if not store_files(args.store).exists():
        raise UsageError(f"{args.store}: no such store (run `stepscope ingest ... --store {args.store}` first)")
    return serve(args.store, args.host, args.port)
