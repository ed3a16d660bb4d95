"""`stepscope dashboard` stops Streamlit with itself: SIGTERM, SIGINT and SIGHUP sent to the
command reach Streamlit, the command waits for it, and the port is free afterwards."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._browser import free_port, wait_http
from tests._dashboard_stores import build_sample_store
from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"),
                                                   reason="reads /proc for the child process")]


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("streamlit")
    return build_sample_store(tmp_path_factory)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_the_command_stops_streamlit_and_frees_the_port(store: Path, sig: signal.Signals) -> None:
    port = free_port()
    command = subprocess.Popen([sys.executable, "-m", "stepscope.cli", "dashboard", "--store", str(store),
                                "--port", str(port)], cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    streamlit: list[int] = []
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", 90)
        streamlit = _children(command.pid)
        assert len(streamlit) == 1
        command.send_signal(sig)
        command.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _alive(streamlit[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(streamlit[0]), "Streamlit outlived the command"
        assert _port_free(port)
    finally:
        for pid in [*streamlit, command.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        command.wait(timeout=10)
