"""Errors say whose fault they are: exit 2 only for what the user typed, 3 for input that cannot
be read, 5 for stepscope's own failures (with the traceback on --debug or STEPSCOPE_DEBUG=1);
every code documented in one place; `stepscope --help` is user help."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stepscope.cli import DESCRIPTION, main
from stepscope.errors import EXIT_CODES
from tests.conftest import REPO

SAMPLE = REPO / "sample_traces" / "cpu-transformer"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stepscope.store.ingest import ingest_paths

    root = tmp_path_factory.mktemp("errors") / "store"
    assert ingest_paths([SAMPLE], root, "cpu").ok
    return root


def _integrity_check_fails(store, run, ranks=None):  # noqa: ANN001, ANN202 - stands in for build_summary
    """An analysis whose own integrity check trips (the interval sweep's ``error(...)``)."""
    return store.sql("SELECT error('interval sweep out of order')")


def test_an_analysis_integrity_check_is_an_internal_error(store: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import stepscope.analysis.summary

    monkeypatch.setattr(stepscope.analysis.summary, "build_summary", _integrity_check_fails)
    monkeypatch.delenv("STEPSCOPE_DEBUG", raising=False)
    assert main(["summary", "--store", str(store)]) == 5
    err = capsys.readouterr().err
    assert err.startswith("stepscope summary: internal error: query failed: ")
    assert "interval sweep out of order" in err and "--debug" in err and "Traceback" not in err
    assert main(["--debug", "summary", "--store", str(store)]) == 5
    assert "Traceback (most recent call last)" in capsys.readouterr().err
    monkeypatch.setenv("STEPSCOPE_DEBUG", "1")
    assert main(["summary", "--store", str(store)]) == 5
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_an_unexpected_exception_is_an_internal_error(store: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import stepscope.analysis.summary

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(stepscope.analysis.summary, "build_summary", broken)
    monkeypatch.delenv("STEPSCOPE_DEBUG", raising=False)
    assert main(["summary", "--store", str(store)]) == 5
    err = capsys.readouterr().err
    assert err.startswith("stepscope summary: internal error: ZeroDivisionError: division by zero")


def test_what_the_user_typed_is_a_usage_error(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", "SELEC 1", "--store", str(store)]) == 2
    assert "SQL error" in capsys.readouterr().err
    assert main(["summary", "--store", str(store), "--run", "nope"]) == 2
    assert "no run 'nope'" in capsys.readouterr().err
    assert main(["compare", "cpu", "cpu", "--store", str(store), "--fail-on", "speed:+5%"]) == 2
    assert "unknown metric 'speed'" in capsys.readouterr().err
    assert main(["runs", "--store", str(store), "--no-such-flag"]) == 2


def test_a_damaged_store_file_is_bad_input_naming_the_file(store: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    damaged = tmp_path / "store"
    shutil.copytree(store, damaged)
    part = next((damaged / "events").rglob("*.parquet"))
    part.write_bytes(b"not parquet at all")
    assert main(["summary", "--store", str(damaged)]) == 3
    err = capsys.readouterr().err
    assert "a store file cannot be read" in err and part.name in err


def test_help_is_for_users(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert DESCRIPTION.split(":")[0] in " ".join(text.split())
    assert "registry" not in text and "``" not in text  # not the module docstring
    assert "exit codes:" in text and re.search(r"^\s+5\s+internal error", text, re.M)
    assert "prune" in text and "--debug" in text


def test_every_exit_code_is_documented_in_one_table() -> None:
    text = (REPO / "docs" / "ci.md").read_text(encoding="utf-8")
    section = re.search(r"## Exit codes\n(.*?)\n## ", text, re.S)
    assert section
    rows = dict(re.findall(r"^\| (\d) \| (.*) \|$", section.group(1), re.M))
    assert {int(code): meaning for code, meaning in rows.items()} == EXIT_CODES
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "docs/ci.md#exit-codes" in readme and "5 internal error" in readme
    assert "ci.md#exit-codes" in (REPO / "docs" / "COMPARE_JSON.md").read_text(encoding="utf-8")
