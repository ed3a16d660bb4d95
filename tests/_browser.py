"""Headless Chromium driven over the DevTools protocol, for the dashboard's end-to-end test.

Why not ``chromium --screenshot``: it returns before Streamlit's websocket has delivered the
page, so the picture is an empty shell. Here we navigate, then poll the DOM until the page is
rendered (its title present, the script finished, charts drawn), then capture. Only the
``websockets`` package (a Streamlit dependency) is needed.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

PAGE_STATE_JS = """
(() => {
  const q = (s) => document.querySelectorAll(s);
  const h1 = document.querySelector('h1');
  return JSON.stringify({
    title: h1 ? h1.innerText : null,
    charts: q('.vega-embed canvas, .vega-embed svg').length,
    exceptions: Array.from(q('[data-testid="stException"], .stException')).map(e => e.innerText.slice(0, 500)),
    errors: Array.from(q('[data-testid="stAlertContentError"]')).map(e => e.innerText.slice(0, 500)),
    running: q('[data-testid="stStatusWidget"] [data-testid="stStatusWidgetRunningIcon"], ' +
               '[data-testid="stStatusWidget"] img').length > 0
             || (document.querySelector('[data-testid="stStatusWidget"]')?.innerText || '').includes('Running'),
    skeletons: q('[data-testid="stSkeleton"], [data-testid="stSpinner"]').length,
  });
})()
"""

EXPAND_JS = """
(() => {
  const labels = %s;
  for (const expander of document.querySelectorAll('[data-testid="stExpander"]')) {
    const summary = expander.querySelector('summary');
    const closed = expander.querySelector('[data-testid="stExpanderDetails"][inert]');  // collapsed content is inert
    if (summary && closed && labels.some(l => summary.textContent.trim().includes(l))) summary.click();
  }
})()
"""


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout: float) -> str:
    """GET ``url`` until it answers 200; its body. Raises TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer within {timeout:.0f} s") from None
            time.sleep(0.25)


class Browser:
    """One headless Chromium with one page, driven over CDP."""

    def __init__(self, executable: str, profile: Path, width: int = 1440, height: int = 1800) -> None:
        from websockets.sync.client import connect

        self._stack = contextlib.ExitStack()
        self.port = free_port()
        self.process = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-dev-shm-usage",
             "--hide-scrollbars", f"--user-data-dir={profile}", f"--remote-debugging-port={self.port}",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            targets = json.loads(wait_http(f"http://127.0.0.1:{self.port}/json/list", 30))
            page = next(t for t in targets if t.get("type") == "page")
            self.ws = self._stack.enter_context(
                connect(page["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024, open_timeout=30))
        except BaseException:
            self.close()
            raise
        self._ids = itertools.count(1)
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its result (events in between are skipped)."""
        ident = next(self._ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def state(self) -> dict[str, Any]:
        return json.loads(self.evaluate(PAGE_STATE_JS))

    def open(self, url: str, *, min_charts: int, timeout: float = 120.0) -> dict[str, Any]:
        """Navigate and wait until the page has a title, is not running, and shows
        ``min_charts`` charts (or an exception/error appeared). Returns the last state.

        ``timeout`` is a hang guard, not a speed target (bench_dashboard.py measures that): the
        test runs beside the others on a busy 2-core machine."""
        self.call("Page.navigate", url=url)
        return self._settle(min_charts, timeout)

    def expand(self, labels: tuple[str, ...], *, min_charts: int, timeout: float = 120.0) -> dict[str, Any]:
        """Open the collapsed expanders whose label holds one of ``labels`` (a click on each,
        as a user opens a section drawn on demand), then wait as :meth:`open` does."""
        self.evaluate(EXPAND_JS % json.dumps(list(labels)))
        return self._settle(min_charts, timeout)

    def _settle(self, min_charts: int, timeout: float) -> dict[str, Any]:
        """Poll until the page has a title, is not running, and shows ``min_charts`` charts (or an
        exception/error appeared), ~1 s unchanged; the last state (``timed_out`` past ``timeout``)."""
        deadline = time.monotonic() + timeout
        stable = 0
        while True:
            time.sleep(0.3)
            state = self.state()
            if state["exceptions"] or state["errors"]:
                return state
            ready = state["title"] and not state["running"] and state["charts"] >= min_charts and not state["skeletons"]
            stable = stable + 1 if ready else 0
            if stable >= 3:  # ~1 s unchanged: Vega has drawn, no rerun pending
                return state
            if time.monotonic() > deadline:
                return {**state, "timed_out": True}

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        self._stack.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
