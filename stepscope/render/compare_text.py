"""The comparison as aligned plain text for a terminal."""

from __future__ import annotations

from stepscope.analysis.compare.comparison import Comparison
from stepscope.analysis.compare.gate import Verdict
from stepscope.render.compare_json import to_json
from stepscope.render.compare_tables import headline, run_line, tables
from stepscope.render.table import to_terminal


def render_text(comparison: Comparison, verdict: Verdict, width: int | None = None) -> str:
    """Verdict first (what a CI log reader looks for), then findings and tables (laid out for a
    terminal ``width`` columns wide, see :func:`stepscope.render.table.to_terminal`)."""
    doc = to_json(comparison, verdict)
    lines = [headline(doc), f"  baseline  {run_line(doc['baseline'], doc.get('absent_reasons', {}).get('baseline'))}",
             f"  candidate {run_line(doc['candidate'])}"]
    lines += [f"  - {r}" for r in doc["verdict"]["reasons"]]
    lines.append("")
    if doc["findings"]:
        lines += ["Findings", "========"] + [f"{f['severity']:8} {f['message']}" for f in doc["findings"]] + [""]
    lines.append(to_terminal(tables(doc), width))
    return "\n".join(lines).rstrip() + "\n"
