"""`stepscope dashboard` and `stepscope demo` command lines (the server itself: test_dashboard_browser)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stepscope.cli import build_parser, main
from stepscope.commands import dashboard


def test_binds_to_localhost_by_default(tmp_path: Path) -> None:
    args = build_parser("dashboard").parse_args(["dashboard", "--store", str(tmp_path)])
    assert (args.host, args.port) == ("127.0.0.1", 8501)
    cmd = dashboard.command(args.store, args.host, args.port)
    assert cmd[:4] == [sys.executable, "-m", "streamlit", "run"]
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--server.headless") + 1] == "true"
    assert cmd[cmd.index("--browser.gatherUsageStats") + 1] == "false"
    assert cmd[-3:] == ["--", "--store", str(tmp_path.resolve())]  # the store only on the command line
    assert dashboard.url("0.0.0.0", 9000) == "http://127.0.0.1:9000/"


def test_missing_store_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboard", "--store", str(tmp_path / "nope")]) == 2
    assert "no such store" in capsys.readouterr().err


def test_demo_no_dashboard_prints_and_returns(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from tests._dashboard_stores import _tiny_trace

    traces = tmp_path / "traces" / "tiny"
    for rank in range(2):
        _tiny_trace(traces / f"rank{rank}.json", rank)
    monkeypatch.setattr(dashboard, "serve", lambda *a: pytest.fail("--no-dashboard must not serve"))
    assert main(["demo", "--store", str(tmp_path / "s"), "--traces", str(tmp_path / "traces"), "--no-dashboard"]) == 0
    assert "tiny" in capsys.readouterr().out


def test_demo_opens_the_dashboard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests._dashboard_stores import _tiny_trace

    _tiny_trace(tmp_path / "traces" / "tiny" / "rank0.json", 0)
    served = []
    monkeypatch.setattr(dashboard, "serve", lambda store, host, port: served.append((store, host, port)) or 0)
    assert main(["demo", "--store", str(tmp_path / "s"), "--traces", str(tmp_path / "traces"), "--port", "8600"]) == 0
    assert served == [(tmp_path / "s", "127.0.0.1", 8600)]


def test_demo_prints_each_runs_breakdown_from_the_analysis(tmp_path, capsys) -> None:
    """The demo's per-rank table sums the analysis layer's host breakdown over the steps."""
    from stepscope.analysis.breakdown import host_breakdown
    from stepscope.cli import main
    from stepscope.store import open_store

    store = tmp_path / "demo"
    assert main(["demo", "--no-dashboard", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    expected = host_breakdown(open_store(store), "ddp-gloo-2ranks").to_pylist()
    for rank in (0, 1):
        total_ms = sum(r["dur_ns"] for r in expected if r["rank"] == rank) / 1e6
        assert f"{total_ms:,.3f}" in out
    assert "ddp-gloo-2ranks: time by category per rank" in out
