"""The gate as JUnit XML: one test case per budget, so CI systems list each budget's result."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from stepscope.analysis.compare.comparison import Comparison
from stepscope.analysis.compare.gate import INCONCLUSIVE, NO_BASELINE, Verdict


def render_junit(comparison: Comparison, verdict: Verdict) -> str:
    """``<testsuite name="stepscope compare">`` with a ``<testcase>`` per budget: a violated budget
    is a ``<failure>``, a budget that could not be judged (metric missing, the runs not
    comparable, a change in the grey zone, no baseline yet) is ``<skipped>`` with the reason; with no baseline and
    ``--missing-baseline fail`` every budget is a ``<failure>`` saying so."""
    suite = ET.Element("testsuite", name="stepscope compare")
    failures = skipped = 0
    not_comparable = verdict.status == INCONCLUSIVE
    for result in verdict.results:
        case = ET.SubElement(suite, "testcase", classname=f"stepscope.{comparison.candidate.run}",
                             name=result.budget.text)
        if verdict.status == NO_BASELINE:
            message = "no baseline yet: " + "; ".join(verdict.reasons)
            if verdict.exit_code == 0 or verdict.missing_baseline == "inconclusive":
                skipped += 1
                ET.SubElement(case, "skipped", message=message)
            else:
                failures += 1
                ET.SubElement(case, "failure", message=message, type=NO_BASELINE).text = message
        elif not_comparable:
            skipped += 1
            ET.SubElement(case, "skipped", message="inconclusive: " + "; ".join(verdict.reasons))
        elif result.status == "not_available" or result.grey:
            skipped += 1
            ET.SubElement(case, "skipped", message=result.message)
        elif result.violated:
            failures += 1
            failure = ET.SubElement(case, "failure", message=result.message, type=result.decided_by)
            failure.text = result.message
        else:
            ET.SubElement(case, "system-out").text = f"{result.message} [{result.decided_by}]"
    suite.set("tests", str(len(verdict.results)))
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    suite.set("errors", "0")
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"
