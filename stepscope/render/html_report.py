"""One self-contained HTML file: overview, findings and (optionally) a comparison, with Altair
charts whose JavaScript (vega, vega-lite, vega-embed) is inlined, so the file opens offline.

The JavaScript bundle comes from ``vl-convert-python`` (``vl_convert.javascript_bundle``), the
package Altair itself uses for its ``inline`` HTML template; it is in the ``dashboard`` extra.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

from stepscope.store.rankstats.parts import Part
from stepscope.errors import UsageError
from stepscope.render.table import Table, to_html


def _vl_convert() -> tuple[object, str]:
    """vl-convert and the Vega-Lite version Altair writes (a clear error without the extra)."""
    try:
        import vl_convert
        from altair.utils._importers import vl_version_for_vl_convert
    except ImportError as exc:
        raise UsageError("stepscope report needs altair and vl-convert-python: pip install 'stepscope[dashboard]'") from exc
    return vl_convert, vl_version_for_vl_convert()


def bundle_key() -> str:
    """What the bundle depends on: vl-convert's and Vega-Lite's versions (a cache key)."""
    vl_convert, vl_version = _vl_convert()
    return f"vl-convert-{getattr(vl_convert, '__version__', 'unknown')}-vega-lite-{vl_version}"


def javascript_bundle() -> str:
    """vega + vega-lite + vega-embed as one script, for the Vega-Lite version Altair writes.
    vl-convert builds it on each call (seconds): keep it under :func:`bundle_key`."""
    vl_convert, vl_version = _vl_convert()
    return vl_convert.javascript_bundle(vl_version=vl_version)  # type: ignore[attr-defined]


def breakdown_chart(rows: list[dict[str, Any]], parts: Sequence[Part]) -> dict[str, Any]:
    """Stacked bars: each step's window split into its parts (ms), one bar per rank and step, in
    the parts' own colours (the dashboard's)."""
    import altair as alt
    import pandas as pd

    long = [{"step": f"r{r['rank']} s{r['step']}", "part": p.label, "ms": r[p.column] / 1e6}
            for r in rows for p in parts]
    labels = [p.label for p in parts]
    chart = alt.Chart(pd.DataFrame(long)).mark_bar().encode(
        x=alt.X("step:N", title="rank / step", sort=None), y=alt.Y("ms:Q", title="ms"),
        color=alt.Color("part:N", sort=labels, scale=alt.Scale(domain=labels, range=[p.color for p in parts])),
        tooltip=["step", "part", "ms"],
    ).properties(title="Where each step's time goes", width=600, height=300)
    return chart.to_dict()


def comparison_chart(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """Grouped bars: median per step of each time metric, baseline against candidate (ms)."""
    import altair as alt
    import pandas as pd

    long = [{"metric": m["label"], "run": side, "ms": m[side]["median"] / 1e6}
            for m in metrics if m["unit"] == "ns" for side in ("baseline", "candidate") if m[side]]
    chart = alt.Chart(pd.DataFrame(long)).mark_bar().encode(
        y=alt.Y("metric:N", sort=None, title=None), x=alt.X("ms:Q", title="median per step (ms)"),
        yOffset="run:N", color="run:N", tooltip=["metric", "run", "ms"],
    ).properties(title="Baseline and candidate", width=600)
    return chart.to_dict()


def render_report(title: str, overview: list[str], findings: list[dict[str, Any]],
                  charts: list[dict[str, Any]], tables: list[Table], bundle: str) -> str:
    """The page. ``charts`` are Vega-Lite specs, embedded with the inlined ``bundle``."""
    divs = "".join(f'<div id="chart{i}"></div>' for i in range(len(charts)))
    embeds = "".join(f"vegaEmbed('#chart{i}', {json.dumps(spec)}, {{actions: false}}).catch(console.error);"
                     for i, spec in enumerate(charts))
    items = "".join(f"<li><b>{html.escape(f['severity'])}</b> {html.escape(f['message'])}</li>" for f in findings)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:left}}.num{{text-align:right}}
.note{{color:#555;font-size:13px}}</style>
<script type="text/javascript">{bundle}</script></head>
<body><h1>{html.escape(title)}</h1>
<h2>Overview</h2><ul>{"".join(f"<li>{html.escape(line)}</li>" for line in overview)}</ul>
<h2>Findings</h2>{f"<ul>{items}</ul>" if items else "<p>No findings.</p>"}
{divs}
{"".join(to_html(t) for t in tables)}
<script type="text/javascript">{embeds}</script>
</body></html>
"""
