"""``stepscope dashboard``: serve the Streamlit dashboard on a store, bound to 127.0.0.1 by default.

Runs ``python -m streamlit run stepscope/dashboard/app.py`` in a child process (Streamlit owns
its event loop and signal handling) and prints the URL. The store path is handed to the app on
its command line, never through the URL.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from stepscope.errors import UsageError

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
DEFAULT_PORT = 8501


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", type=Path, required=True, help="store folder")
    add_server_arguments(parser)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """``--port`` and ``--host``: shared with ``stepscope demo``."""
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 shares it)")


def command(store: Path, host: str, port: int) -> list[str]:
    """The ``streamlit run`` command line for ``store``."""
    return [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.address", host, "--server.port", str(port), "--server.headless", "true",
        "--browser.gatherUsageStats", "false", "--server.runOnSave", "false",
        "--runner.magicEnabled", "false", "--client.toolbarMode", "minimal",
        "--", "--store", str(store.resolve()),
    ]


def url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{shown}:{port}/"


def serve(store: Path, host: str, port: int) -> int:
    """Start the server and wait for it; Ctrl-C stops it."""
    try:
        import streamlit  # noqa: F401  (only to say clearly when the extra is missing)
    except ImportError as exc:
        raise UsageError("the dashboard needs streamlit and altair: pip install 'stepscope[dashboard]'") from exc
    if not 0 < port < 65536:
        raise UsageError(f"--port {port}: not a port number")
    print(f"stepscope dashboard on {store.resolve()}: {url(host, port)}  (Ctrl-C stops it)", flush=True)
    process = subprocess.Popen(command(store, host, port))
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        process.wait()
        return 0


def run(args: argparse.Namespace) -> int:
    if not args.store.is_dir():
        raise UsageError(f"{args.store}: no such store (run `stepscope ingest ... --store {args.store}` first)")
    return serve(args.store, args.host, args.port)
