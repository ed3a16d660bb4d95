"""`stepscope dashboard` and `stepscope demo` command lines (the server itself: test_dashboard_browser)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.cli import build_parser, main
from tests.conftest import REPO
from stepscope.commands import dashboard


def test_binds_to_localhost_by_default(tmp_path: Path) -> None:
    args = build_parser("dashboard").parse_args(["dashboard", "--store", str(tmp_path)])
    assert (args.host, args.port) == ("127.0.0.1", 8501)
    cmd = dashboard.command(args.store, args.host, args.port)
    assert cmd[:4] == [sys.executable, "-m", "stepscope.dashboard.server", "run"]
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--server.headless") + 1] == "true"
    assert cmd[cmd.index("--browser.gatherUsageStats") + 1] == "false"
    assert cmd[-3:] == ["--", "--store", str(tmp_path.resolve())]  # the store only on the command line
    assert dashboard.url("0.0.0.0", 9000) == "http://127.0.0.1:9000/"


def _imports(path: Path) -> set[str]:
    """The modules ``path`` imports (``import x``, ``from x import y``), as named."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return names | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}


def test_the_server_warms_every_module_the_pages_import_that_does_not_use_streamlit() -> None:
    """What a page or a dashboard helper imports, outside the dashboard and the standard library
    and without Streamlit, is imported by the server while it starts (``warm_imports``, run in a
    fresh interpreter): a module added to a page without it there costs the first visitor its
    import again."""
    from stepscope.dashboard import server

    folder = Path(server.__file__).parent
    scripts = [*folder.glob("*.py"), *(folder / "views").glob("*.py")]
    wanted = {name for script in scripts for name in _imports(script)
              if name.split(".")[0] not in sys.stdlib_module_names and name != "__future__"
              and not name.startswith(("streamlit", "stepscope.dashboard"))}
    probe = ("import sys; from stepscope.dashboard.server import warm_imports; warm_imports(); "
             "print(' '.join(sys.modules))")
    loaded = set(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                cwd=REPO).stdout.split())
    assert wanted - loaded == set()
    assert not any(name.startswith("streamlit") for name in loaded)


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


def test_demo_prints_each_runs_first_screen_as_summary_does(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    """The demo prints, for every sample run, the verdict screen that ``stepscope summary``
    opens with (the same text, from the same analysis), not a table of its own.

    The store starts as the session's store of every sample run (ingested once per test run,
    no analysis cache): the demo's ingest of them is the ingest that built it
    (``ingest_paths([folder], store, folder.name)``), and the demo run twice reuses its store,
    so the demo finds every trace stored and computes each verdict afresh. Its ingest into an
    empty store is test_demo_no_dashboard_prints_and_returns'."""
    from stepscope.cli import main
    from stepscope.store import open_store
    from tests._dashboard_stores import build_sample_store
    from tests.conftest import copy_store

    store = copy_store(build_sample_store(tmp_path_factory), tmp_path / "demo")
    assert main(["demo", "--no-dashboard", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    with open_store(store) as opened:
        runs = opened.sql("SELECT run FROM runs ORDER BY run")["run"].to_pylist()
    assert "ddp-gloo-2ranks" in runs and len(runs) >= 2
    for run in runs:
        assert main(["summary", "--run", run, "--store", str(store)]) == 0
        screen = capsys.readouterr().out
        verdict = screen[:screen.index("Findings")]  # the header and what bounds the step
        assert verdict in out, run
        assert f"run {run}: " in verdict and "step time" in verdict
