"""The comparison as GitHub-flavoured Markdown, sized for a job summary (``$GITHUB_STEP_SUMMARY``)."""

from __future__ import annotations

from stepscope.analysis.compare.comparison import Comparison
from stepscope.analysis.compare.gate import Verdict
from stepscope.render.compare_json import to_json
from stepscope.render.compare_tables import Table, headline, run_line, tables


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(t: Table) -> list[str]:
    out = [f"### {t.title}", ""]
    if t.note:
        out += [f"_{t.note}_", ""]
    if t.rows:
        out.append("| " + " | ".join(t.header) + " |")
        out.append("|" + "|".join("---" for _ in t.header) + "|")
        out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in t.rows]
        out.append("")
    return out


def render_markdown(comparison: Comparison, verdict: Verdict) -> str:
    """A Markdown report: verdict and reasons, findings, then the tables."""
    doc = to_json(comparison, verdict)
    lines = [f"## stepscope compare: {headline(doc)}", "",
             f"- baseline {run_line(doc['baseline'])}", f"- candidate {run_line(doc['candidate'])}", ""]
    if doc["verdict"]["reasons"]:
        lines += ["**Why:**", ""] + [f"- {_cell(r)}" for r in doc["verdict"]["reasons"]] + [""]
    if doc["findings"]:
        lines += ["### Findings", ""] + [f"- **{f['severity']}** {_cell(f['message'])}" for f in doc["findings"]] + [""]
    else:
        lines += ["No notable change.", ""]
    for t in tables(doc):
        lines += _table(t)
    return "\n".join(lines).rstrip() + "\n"
