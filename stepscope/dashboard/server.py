"""The dashboard's server process: ``streamlit run``, with the pages' heavy imports begun first.

Streamlit imports a page's modules when the first visitor's session runs it, so the first open
of the dashboard paid for importing pandas, Altair, PyArrow, DuckDB and the analysis layer
(~1.3 s of CPU on the 2-core machine, measured) before it could compute anything. Here a thread
imports them while the server starts, so the first visitor finds them loaded (a module being
imported when the page asks for it is waited for, never imported twice: Python's import lock).

Only modules that do not use Streamlit are warmed: a module decorated with ``st.cache_data``
imported before the server's runtime exists would bind its caches to a bare in-memory storage.
``tests/test_dashboard_command.py`` checks that every such module a page imports is warmed.
"""

from __future__ import annotations

import sys
import threading


def warm_imports() -> None:
    """Import what the pages import (the standard library, Streamlit and the dashboard's own
    modules aside; ``tests/test_dashboard_command.py`` keeps this whole), then build one Altair
    chart's spec (the first one loads the Vega-Lite schema). Plain imports, not names: a renamed
    analysis fails here as it would in its page. A failure is the page's to report when it
    imports the module itself."""
    try:
        import altair as alt
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401

        import stepscope.analysis.absent  # noqa: F401
        import stepscope.analysis.breakdown  # noqa: F401
        import stepscope.analysis.comm  # noqa: F401
        import stepscope.analysis.compare.comparison  # noqa: F401
        import stepscope.analysis.copies  # noqa: F401
        import stepscope.analysis.critical_path  # noqa: F401
        import stepscope.analysis.findings  # noqa: F401
        import stepscope.analysis.flops  # noqa: F401
        import stepscope.analysis.kernels  # noqa: F401
        import stepscope.analysis.memory  # noqa: F401
        import stepscope.analysis.pipeline  # noqa: F401
        import stepscope.analysis.sections  # noqa: F401
        import stepscope.analysis.snapshot  # noqa: F401
        import stepscope.analysis.steps  # noqa: F401
        import stepscope.analysis.summary  # noqa: F401
        import stepscope.analysis.timeline  # noqa: F401
        import stepscope.analysis.windows  # noqa: F401
        import stepscope.errors  # noqa: F401
        import stepscope.store.catalog  # noqa: F401
        import stepscope.store.export  # noqa: F401
        import stepscope.store.location  # noqa: F401
        import stepscope.store.rankstats.parts  # noqa: F401
        import stepscope.units  # noqa: F401

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
