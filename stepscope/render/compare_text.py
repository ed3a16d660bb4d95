"""The comparison as aligned plain text for a terminal."""

from __future__ import annotations

from stepscope.analysis.compare.comparison import Comparison
from stepscope.analysis.compare.gate import Verdict
from stepscope.render.compare_json import to_json
from stepscope.render.compare_tables import Table, headline, run_line, tables


def _table(t: Table) -> list[str]:
    out = [t.title, "=" * len(t.title)]
    if t.note:
        out.append(t.note)
    if t.rows:
        widths = [max(len(h), *(len(r[i]) for r in t.rows)) for i, h in enumerate(t.header)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        out += [line(t.header), line(["-" * w for w in widths])] + [line(r) for r in t.rows]
    return out + [""]


def render_text(comparison: Comparison, verdict: Verdict) -> str:
    """Verdict first (what a CI log reader looks for), then findings and tables."""
    doc = to_json(comparison, verdict)
    lines = [headline(doc), f"  baseline  {run_line(doc['baseline'])}", f"  candidate {run_line(doc['candidate'])}"]
    lines += [f"  - {r}" for r in doc["verdict"]["reasons"]]
    lines.append("")
    if doc["findings"]:
        lines += ["Findings", "========"] + [f"{f['severity']:8} {f['message']}" for f in doc["findings"]] + [""]
    for t in tables(doc):
        lines += _table(t)
    return "\n".join(lines).rstrip() + "\n"
