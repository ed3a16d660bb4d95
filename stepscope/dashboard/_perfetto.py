"""Open a rank's trace in ui.perfetto.dev in one click, at a chosen step.

Perfetto's documented way of opening a trace from another page ("Deep linking to the Perfetto
UI", perfetto.dev/docs/visualization/deep-linking-to-perfetto-ui): ``window.open`` the UI, post
``'PING'`` until it answers ``'PONG'`` (the channel is not buffered), then post
``{perfetto: {buffer, title, fileName, keepApiOpen: true}}`` with the trace as an ArrayBuffer;
with the API kept open, ``{perfetto: {timeStart, timeEnd}}`` (seconds, in the trace's time)
scrolls the timeline to the step (the UI's ``PostedScrollToRange`` message, which it retries
until the trace has loaded). The browser does all of it: the trace never leaves the machine
except for the tab the user opens. The UI must be opened by a user's click (pop-up blockers).

The trace handed over is the rank's events as :func:`stepscope.store.export.export_chrome_trace`
writes them (one document even for a rank of several traces), whose ``ts`` are microseconds
after its ``baseTimeNanoseconds`` (the first event's whole microsecond). Perfetto reads ``ts`` as
written, so the step's window is given in that domain (:func:`trace_seconds`).
"""

from __future__ import annotations

import base64
import gzip
import html
import json
from typing import Any

PERFETTO_ORIGIN = "https://ui.perfetto.dev"
MAX_INLINE_BYTES = 96 * 2**20
"""Largest (gzipped) trace handed to the page inline; a bigger one is offered as a download."""


def rank_trace(store: Any, run: str, rank: int) -> tuple[bytes, int]:
    """The rank's trace for Perfetto (gzipped export) and the base its ``ts`` are relative to
    (the export's rule: the first event's whole microsecond)."""
    from stepscope.store.export import export_chrome_trace

    first = store.sql("SELECT min(ts_ns) AS t FROM events WHERE run = $run AND rank = $rank",
                      {"run": run, "rank": int(rank)}).to_pylist()[0]["t"]
    return gzip.compress(export_chrome_trace(store, run, rank), compresslevel=1), (first or 0) // 1000 * 1000


def trace_seconds(ns: int, base_ns: int) -> float:
    """An epoch time in ns as the trace's own ``ts`` domain reads it in Perfetto, in seconds."""
    return (ns - base_ns) / 1e9


def open_button_html(data: bytes, title: str, file_name: str, start_s: float | None, end_s: float | None) -> str:
    """A button that opens ``data`` (a gzipped Chrome/Kineto JSON trace) in ui.perfetto.dev and,
    when the step's window is known, scrolls to it (module docs)."""
    payload = base64.b64encode(data).decode()
    scroll = "null" if start_s is None or end_s is None else json.dumps({"timeStart": start_s, "timeEnd": end_s})
    return f"""
<button id="open" style="font: inherit; padding: 0.4em 1em; cursor: pointer">Open in Perfetto: {html.escape(title)}</button>
<span id="state" style="font: 0.85em sans-serif; margin-left: 1em"></span>
<script>
const ORIGIN = {json.dumps(PERFETTO_ORIGIN)};
const B64 = "{payload}";
const SCROLL = {scroll};
document.getElementById("open").onclick = () => {{
  const state = document.getElementById("state");
  const ui = window.open(ORIGIN);
  if (!ui) {{ state.textContent = "the browser blocked the new tab: allow pop-ups for this page"; return; }}
  const bytes = Uint8Array.from(atob(B64), c => c.charCodeAt(0));
  const ping = setInterval(() => ui.postMessage("PING", ORIGIN), 50);
  const onMessage = (evt) => {{
    if (evt.source !== ui || evt.data !== "PONG") return;
    clearInterval(ping);
    window.removeEventListener("message", onMessage);
    ui.postMessage({{perfetto: {{buffer: bytes.buffer, title: {json.dumps(title)}, fileName: {json.dumps(file_name)},
                                 keepApiOpen: true}}}}, ORIGIN);
    if (SCROLL) ui.postMessage({{perfetto: SCROLL}}, ORIGIN);
    state.textContent = "opened in the new tab";
  }};
  window.addEventListener("message", onMessage);
  state.textContent = "opening ui.perfetto.dev...";
}};
</script>
"""
