"""The shared analysis conventions: abstention, the rule registry and the section registry."""

from __future__ import annotations

import json

import pytest

from stepscope.analysis import RULES, Absent, Finding, Rule, Severity, evaluate, jsonable, rule
from stepscope.analysis.sections import all_sections, section, SECTIONS


def _warn(results):
    yield Finding(Severity.WARNING, "t.warn", "slow", {"value": results["a"]})


def _crit(results):
    yield Finding(Severity.CRITICAL, "t.crit", "worse", {})


def test_absent_is_falsy_and_not_zero() -> None:
    absent = Absent("no GPU events")
    assert not absent
    assert absent != 0
    assert "no GPU events" in str(absent)


def test_jsonable_puts_every_null_next_to_its_reason() -> None:
    doc = jsonable({"x": 1, "y": Absent("no steps"), "rows": [Absent("missing rank 3"), {"z": Absent("r")}]})
    assert doc == {
        "x": 1,
        "y": None,
        "rows": [{"absent_reason": "missing rank 3"}, {"z": None, "absent_reasons": {"z": "r"}}],
        "absent_reasons": {"y": "no steps"},
    }
    json.dumps(doc)


def test_evaluate_skips_rules_whose_sections_are_absent_or_missing() -> None:
    rules = [Rule("t.warn", ("a",), _warn, ""), Rule("t.crit", ("b",), _crit, "")]
    assert [f.rule for f in evaluate({"a": 7, "b": 1}, rules)] == ["t.crit", "t.warn"]
    assert [f.rule for f in evaluate({"a": 7, "b": Absent("none")}, rules)] == ["t.warn"]
    assert evaluate({}, rules) == []


def test_a_rule_cannot_speak_for_another_rule() -> None:
    with pytest.raises(ValueError, match="yielded a finding for"):
        evaluate({"a": 1}, [Rule("t.other", ("a",), _warn, "")])


def test_rule_decorator_registers_once() -> None:
    try:
        rule("t.registered", needs=("a",))(_warn)
        assert RULES["t.registered"].needs == ("a",)
        with pytest.raises(ValueError, match="registered twice"):
            rule("t.registered", needs=("a",))(_crit)
    finally:
        RULES.pop("t.registered", None)


def test_section_names_of_the_json_contract_are_reserved() -> None:
    with pytest.raises(ValueError, match="reserved"):
        section("findings", order=1, to_json=dict)


def test_every_registered_rule_and_section_is_documented() -> None:
    all_sections()  # imports every analysis module
    for r in RULES.values():
        assert r.doc, f"rule {r.id} has no docstring"
        assert all(name in SECTIONS for name in r.needs), f"rule {r.id} needs an unknown section"
    for s in SECTIONS.values():
        assert s.doc, f"section {s.name} has no docstring"


def test_every_rule_and_section_is_in_the_docs() -> None:
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs"
    analysis = (docs / "ANALYSIS.md").read_text()
    summary = (docs / "SUMMARY_JSON.md").read_text()
    all_sections()
    for r in RULES:
        assert f"`{r}`" in analysis, f"rule {r} is not documented in docs/ANALYSIS.md"
    for name in SECTIONS:
        assert f"`{name}`" in summary, f"section {name} is not documented in docs/SUMMARY_JSON.md"
