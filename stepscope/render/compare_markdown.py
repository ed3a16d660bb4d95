"""The comparison as GitHub-flavoured Markdown, sized for a job summary (``$GITHUB_STEP_SUMMARY``)."""

from __future__ import annotations

from stepscope.analysis.compare.comparison import Comparison
from stepscope.analysis.compare.gate import Verdict
from stepscope.render.compare_json import to_json
from stepscope.render.compare_tables import headline, run_line, tables
from stepscope.render.table import md_escape, to_markdown


def render_markdown(comparison: Comparison, verdict: Verdict) -> str:
    """A Markdown report: verdict and reasons, findings, then the tables."""
    doc = to_json(comparison, verdict)
    lines = [f"## stepscope compare: {headline(doc)}", "",
             f"- baseline {run_line(doc['baseline'], doc.get('absent_reasons', {}).get('baseline'))}",
             f"- candidate {run_line(doc['candidate'])}", ""]
    if doc["verdict"]["reasons"]:
        lines += ["**Why:**", ""] + [f"- {md_escape(r)}" for r in doc["verdict"]["reasons"]] + [""]
    if doc["verdict"]["status"] == "no_baseline":
        lines += ["No baseline yet: nothing was compared; the candidate's own figures follow.", ""]
    elif doc["findings"]:
        lines += ["### Findings", ""] + [f"- **{f['severity']}** {md_escape(f['message'])}" for f in doc["findings"]] + [""]
    else:
        lines += ["No notable change.", ""]
    lines += [to_markdown(t) for t in tables(doc)]
    return "\n".join(lines).rstrip() + "\n"
