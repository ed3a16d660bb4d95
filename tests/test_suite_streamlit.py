"""The suite's Streamlit shortcuts (tests/conftest.py) leave what an AppTest runs unchanged.

Streamlit is imported when this file is collected, as by every AppTest file, so the session's
shortcuts are in place when these tests run."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.runtime.scriptrunner.script_cache import ScriptCache  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402


def test_a_script_is_compiled_once_for_every_apptest_and_again_when_it_changes(tmp_path: Path) -> None:
    script = tmp_path / "page.py"
    script.write_text('import streamlit as st\nst.title("first")\n', encoding="utf-8")
    first = AppTest.from_file(str(script))
    first.run()
    compiled = ScriptCache().get_bytecode(str(script))
    again = AppTest.from_file(str(script))
    again.run()
    assert ScriptCache().get_bytecode(str(script)) is compiled
    assert [t.value for t in again.title] == ["first"]
    script.write_text('import streamlit as st\nst.title("changed")\n"magic is on"\n', encoding="utf-8")
    changed = AppTest.from_file(str(script))
    changed.run()
    assert ScriptCache().get_bytecode(str(script)) is not compiled
    assert [t.value for t in changed.title] == ["changed"]
    assert [m.value for m in changed.markdown] == ["magic is on"]
