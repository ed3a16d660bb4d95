"""The dashboard's server process: ``streamlit run``, with the pages' heavy imports begun first.

Streamlit imports a page's modules when the first visitor's session runs it, so the first open
of the dashboard paid for importing pandas, Altair, PyArrow, DuckDB and the analysis layer
(~1.3 s of CPU on the 2-core machine, measured) before it could compute anything. Here a thread
imports them while the server starts, so the first visitor finds them loaded (a module being
imported when the page asks for it is waited for, never imported twice: Python's import lock).

Only modules that do not use Streamlit are warmed: a module decorated with ``st.cache_data``
imported before the server's runtime exists would bind its caches to a bare in-memory storage.
``tests/test_dashboard_command.py`` checks that every such module a page imports is listed here.
"""

from __future__ import annotations

import importlib
import sys
import threading

WARM_MODULES = (
    "altair",
    "pandas",
    "pyarrow",
    "stepscope.analysis.absent",
    "stepscope.analysis.breakdown",
    "stepscope.analysis.comm",
    "stepscope.analysis.compare.comparison",
    "stepscope.analysis.copies",
    "stepscope.analysis.critical_path",
    "stepscope.analysis.findings",
    "stepscope.analysis.flops",
    "stepscope.analysis.kernels",
    "stepscope.analysis.memory",
    "stepscope.analysis.pipeline",
    "stepscope.analysis.sections",
    "stepscope.analysis.snapshot",
    "stepscope.analysis.steps",
    "stepscope.analysis.summary",
    "stepscope.analysis.timeline",
    "stepscope.analysis.windows",
    "stepscope.errors",
    "stepscope.store",
    "stepscope.store.catalog",
    "stepscope.store.export",
    "stepscope.store.location",
    "stepscope.store.rankstats.parts",
    "stepscope.units",
)
"""What the pages import that does not import Streamlit (the test keeps this list whole)."""


def warm_imports() -> None:
    """Import :data:`WARM_MODULES`, then build one Altair chart's spec (its first one loads the
    Vega-Lite schema). A failure here is the page's to report when it imports the module itself."""
    try:
        for name in WARM_MODULES:
            importlib.import_module(name)
        import altair as alt

        alt.Chart({"values": [{"x": 0}]}).mark_bar().encode(x="x:Q").to_dict()
    except Exception:  # noqa: BLE001 - the page imports the module again and shows its error
        return


def main() -> None:
    """``python -m stepscope.dashboard.server run app.py ...``: Streamlit's own command line."""
    threading.Thread(target=warm_imports, name="stepscope-warm-imports", daemon=True).start()
    from streamlit.web.cli import main as streamlit_main

    sys.exit(streamlit_main(prog_name="streamlit"))


if __name__ == "__main__":
    main()
