"""stepscope dashboard: the Streamlit entry point (``streamlit run app.py -- --store DIR``).

Opens the store given on the command line, draws the shared filters in the sidebar and runs the
chosen page. A store that cannot be shown (missing, empty, written by a newer stepscope) gets one
clear message instead of a traceback. Start it with ``stepscope dashboard --store DIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

from stepscope.dashboard._data import StoreProblem, open_checked, revalidate, store_root_from_argv
from stepscope.dashboard._filters import sidebar

HERE = Path(__file__).resolve().parent

# (file under views/, title, icon) in menu order; the URL path is the file's stem. The folder is
# not called ``pages/``: Streamlit treats a ``pages/`` folder beside the main script as an
# old-style multipage app and then runs page files without this script, so the store and the
# filters would never be set up. (Comments, not docstrings: Streamlit would print a bare string.)
PAGES: tuple[tuple[str, str, str], ...] = (
    ("runs.py", "Runs", ":material/list:"),
    ("overview.py", "Overview", ":material/bar_chart:"),
    ("communication.py", "Communication", ":material/hub:"),
    ("copies.py", "Offload & copies", ":material/swap_horiz:"),
    ("memory.py", "Memory", ":material/memory:"),
    ("kernels.py", "Kernels & ops", ":material/functions:"),
    ("pipeline.py", "Pipeline & FLOPs", ":material/view_timeline:"),
    ("compare.py", "Compare", ":material/compare_arrows:"),
    ("sql.py", "SQL", ":material/terminal:"),
)


def main() -> None:
    st.set_page_config(page_title="stepscope", page_icon=":material/timer:", layout="wide")
    pages = [
        st.Page(str(HERE / "views" / file), title=title, icon=icon, url_path=file[:-3], default=i == 1)
        for i, (file, title, icon) in enumerate(PAGES)
    ]
    nav = st.navigation(pages)
    try:
        root, runs = open_checked(store_root_from_argv(sys.argv[1:]))
    except StoreProblem as exc:
        st.error(str(exc), icon=":material/error:")
        st.stop()
    st.session_state["ctx"] = sidebar(root, runs)
    nav.run()
    revalidate(root)  # after the page is drawn: the listing never competes with it


main()
