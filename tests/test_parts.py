"""The step-part catalogue (stepscope.store.rankstats.parts) is the only place that lists the parts.

- its own rules (priority order, the rest part last, hidden parts over claimed parts);
- the SQL generated from it: a catalogue with a part claiming two classes gives the exclusive,
  hidden and rest times a hand count gives;
- every consumer's output follows it (breakdown columns, summary keys and terminal columns,
  compare metrics and budgets, dashboard labels and colours, the docs' tables and lists);
- no module outside the catalogue lists parts by hand (a source scan that is shown to fail).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import duckdb
import pytest

from stepscope.store.rankstats import parts
from stepscope.analysis._sql import sweep_ctes
from stepscope.store.rankstats.parts import BREAKDOWNS, GPU, HOST, Breakdown, Hidden, Part
from tests.conftest import REPO

PACKAGE = REPO / "stepscope"
DOCS = REPO / "docs"


# ---- the catalogue's own rules ------------------------------------------------------------


def _part(name: str, *claims: str, **kw: Any) -> Part:
    return Part(name, name.replace("_", " "), f"{name} runs", color="#000000", claims=claims, **kw)


def test_catalogue_is_ordered_and_complete() -> None:
    assert [p.name for p in GPU.parts] == ["compute", "comm_exposed", "memcpy_h2d_exposed", "memcpy_d2h_exposed",
                                           "memcpy_d2d_exposed", "memcpy_other_exposed", "memset_exposed", "idle"]
    assert [p.name for p in HOST.parts] == ["data_loading", "optimizer", "sync_wait", "compute_ops", "communication_ops",
                                            "other"]
    assert [p.name for p in parts.COMM_EXPOSED.sub_parts] == ["comm_wait", "comm_transfer"]
    assert [p.name for p in parts.COMMUNICATION_OPS.sub_parts] == ["communication_wait", "communication_transfer"]
    for breakdown in BREAKDOWNS:
        entries = list(breakdown.entries())
        assert len({e.column for e in entries}) == len(entries)
        assert len({e.label for e in entries}) == len(entries), "a label names one part"
        assert all(re.fullmatch(r"#[0-9A-F]{6}", p.color) for p in breakdown.with_sub_parts())
        assert all(p.definition and p.label for p in entries)
    # The budget metric names are a contract (docs/COMPARE_JSON.md, users' stepscope.toml).
    assert list(GPU.budget_metrics()) == ["compute", "comm_exposed", "comm_wait", "comm_transfer", "memcpy_h2d_exposed",
                                          "memcpy_d2h_exposed", "memcpy_d2d_exposed", "memcpy_other_exposed",
                                          "memset_exposed", "idle"]


def test_catalogue_refuses_malformed_breakdowns() -> None:
    a, b, rest = _part("a", "cls = 0"), _part("b", "cls = 1"), _part("rest")
    with pytest.raises(ValueError, match="the last claims none"):
        Breakdown("t", ("kernel",), (a, b))
    with pytest.raises(ValueError, match="the last claims none"):
        Breakdown("t", ("kernel",), (a, rest, b))
    with pytest.raises(ValueError, match="duplicate"):
        Breakdown("t", ("kernel",), (a, _part("a", "cls = 1"), rest))
    with pytest.raises(ValueError, match="after the sweep"):
        Breakdown("t", ("kernel",), (a, _part("rest", sub_parts=(_part("x", "cls = 2"),))))
    with pytest.raises(ValueError, match="hidden time"):
        Breakdown("t", ("kernel",), (a, rest), (Hidden("h", "h", "h", of=(rest,), under=(a,)),))


# ---- the SQL generated from a catalogue ------------------------------------------------------


def test_generated_sums_follow_priority_multi_class_parts_and_hidden_time() -> None:
    """A made-up catalogue: part ``ab`` claims classes 0 and 1, ``c`` class 2, then the rest.
    Intervals (class, t0, t1) on one rank, window [0, 100):
    class 0 [10, 30), class 1 [20, 50), class 2 [40, 70), class 2 [80, 90).
    By hand: ab = |[10, 50)| = 40; c = |[50, 70)| + |[80, 90)| = 30; rest = 100 - 70 = 30;
    hidden c under ab = |[40, 50)| = 10."""
    from stepscope.store.rankstats.breakdown import part_sums

    ab, c, rest = _part("ab", "cls = 0", "cls = 1"), _part("c", "cls = 2"), _part("rest")
    hidden = Hidden("c_under_ab", "c under ab", "c under ab", of=(c,), under=(ab,))
    made_up = Breakdown("made_up", ("kernel",), (ab, c, rest), (hidden,))
    assert made_up.classes == ("cls = 0", "cls = 1", "cls = 2") and made_up.class_ids(ab) == (0, 1)
    query = f"""
    WITH iv AS (SELECT * FROM (VALUES (0, 10, 30, 0), (0, 20, 50, 1), (0, 40, 70, 2), (0, 80, 90, 2))
                AS t(rank, t0, t1, cls)),
         win AS (SELECT 0 AS rank, 1 AS step, 0 AS w0, 100 AS w1),
         {sweep_ctes(len(made_up.classes))}
    SELECT {", ".join(part_sums(made_up))} FROM seg
    """
    row = duckdb.connect().execute(query).fetchone()
    assert dict(zip(made_up.all_columns, row)) == {"ab_ns": 40, "c_ns": 30, "rest_ns": 30, "c_under_ab_ns": 10}


def test_every_gpu_category_the_store_writes_has_exactly_its_class() -> None:
    """Each category ``classify`` gives GPU work lands in a class of the generated ``CASE`` (an
    unclaimed one would fail the breakdown query), and every class is reached (a claim that no
    category matches would be a part that is always zero)."""
    from stepscope.store.rankstats.breakdown import class_case
    from stepscope.store.classify import classify

    samples = [("kernel", "sgemm_128x64"), ("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
               ("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)"), ("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)"),
               ("gpu_memcpy", "Memcpy DtoD (Device -> Device)"), ("gpu_memcpy", "Memcpy"),
               ("gpu_memset", "Memset (Device)")]
    rows = [(*classify(cat, name, "X"), name) for cat, name in samples]
    assert {kind for kind, _, _ in rows} == set(GPU.kinds)
    values = ", ".join(f"('{kind}', '{category}', '{name}')" for kind, category, name in rows)
    case = class_case(GPU, otherwise="NULL")
    classes = duckdb.connect().execute(
        f"SELECT {case} FROM (VALUES {values}) AS events(kind, category, name)").fetchall()
    assert sorted(c for (c,) in classes) == list(range(len(GPU.classes)))


def test_every_split_part_has_its_split_rule() -> None:
    """A part with sub-parts needs the SQL that splits it (breakdown.SPLITS), on the GPU and on
    the host alike."""
    from stepscope.analysis.breakdown import SPLITS
    from stepscope.store.rankstats.breakdown import IDLE_CAUSE_RULES

    assert {p for b in BREAKDOWNS for p in b.parts if p.sub_parts} == set(SPLITS)
    assert set(IDLE_CAUSE_RULES) == set(parts.IDLE.sub_parts)


# ---- every consumer follows the catalogue ---------------------------------------------------


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One step: a compute kernel, a communication kernel partly under it, a DataLoader annotation."""
    from stepscope.store import open_store
    from stepscope.store.ingest import ingest_paths
    from tests.conftest import write_trace

    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
         "pid": 1, "tid": 1, "ts": 1, "dur": 9},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 20},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 12, "dur": 2,
         "args": {"correlation": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 14, "dur": 2,
         "args": {"correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": 20, "dur": 30,
         "args": {"correlation": 1, "stream": 7, "device": 0}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 8, "ts": 40,
         "dur": 30, "args": {"correlation": 2, "stream": 8, "device": 0}},
    ]
    root = tmp_path_factory.mktemp("parts-store")
    trace = write_trace(root / "traces" / "rank0.json", events)
    report = ingest_paths([trace], root / "store", "t")
    assert report.ok, report.errors
    return open_store(root / "store")


def test_breakdown_tables_have_the_catalogue_columns(tiny_store: Any) -> None:
    from stepscope.analysis.breakdown import host_breakdown, step_breakdown

    gpu = step_breakdown(tiny_store, "t")
    assert gpu.column_names == ["run", "rank", "step", "start_ns", "end_ns", "dur_ns", "cpu_start_ns", "cpu_dur_ns",
                                *GPU.all_columns]
    row = gpu.to_pylist()[0]
    # compute [20, 50) us, communication [40, 70) us: 10 us of it under compute.
    assert (row[parts.COMPUTE.column], row[parts.COMM_EXPOSED.column], row[parts.COMM_OVERLAPPED.column]) == (
        30_000, 20_000, 10_000)
    assert sum(row[c] for c in GPU.columns) == row["dur_ns"]
    host = host_breakdown(tiny_store, "t")
    assert host.column_names == ["run", "rank", "step", "start_ns", "end_ns", "dur_ns", *HOST.all_columns]
    assert host.to_pylist()[0][parts.DATA_LOADING.column] == 9_000


def test_summary_keys_and_terminal_columns_follow_the_catalogue(tiny_store: Any) -> None:
    from stepscope.analysis.summary import build_summary
    from stepscope.commands.summary import render_table

    doc = build_summary(tiny_store, "t")
    step = doc["ranks"][0]["steps"][0]
    assert [k for k in step if k.endswith("_ns") and k not in ("dur_ns", "start_ns", "end_ns", "cpu_dur_ns")] == list(
        GPU.all_columns)
    # one rank: no peer to match, so the waiting/transfer splits are absent (with their reasons)
    assert [k for k in step["host"] if k != "absent_reasons"] == [*HOST.all_columns, "dur_ns"]
    assert set(step["absent_reasons"]) == {p.column for p in parts.COMM_EXPOSED.sub_parts}
    text = render_table(doc, sections=("ranks",))
    gpu_header = next(line for line in text.splitlines() if line.startswith("step ") and "  step time  " in line)
    headers = [e.short for e in (*GPU.with_sub_parts(), *GPU.hidden) if e.short]
    assert re.split(r"\s{2,}", gpu_header) == ["step", "step time", *headers]


def test_compare_metrics_and_budgets_follow_the_catalogue() -> None:
    from stepscope.analysis.compare.budgets import BUDGET_METRICS, parse_budget
    from stepscope.analysis.compare.comparison import compare_profiles
    from stepscope.analysis.compare.metrics import RunFacts, RunProfile

    assert list(BUDGET_METRICS)[: len(GPU.budget_metrics()) + 2] == ["step_time", *GPU.budget_metrics(), "peak_memory"]
    for metric in GPU.budget_metrics():
        assert parse_budget(f"{metric}:+2ms").threshold == 2e6
    facts = RunFacts("r", None, (0,), 1, None, (), None, None, 1)
    samples = {m: [1.0] for m in BUDGET_METRICS if m != "peak_memory"}
    profile = RunProfile(facts, "step_windows", samples, [1.0], "gpu", [], [], [], {})
    metrics = compare_profiles(profile, profile).metrics
    by_name = {m.metric: m for m in metrics}
    for metric, part in GPU.budget_metrics().items():
        assert (by_name[metric].label, by_name[metric].unit, by_name[metric].source) == (
            part.label, part.unit, f"step_breakdown.{part.column}")
    assert [m.metric for m in metrics] == list(BUDGET_METRICS)


def test_dashboard_charts_use_the_catalogue_labels_and_colours(monkeypatch: pytest.MonkeyPatch,
                                                              tiny_store: Any) -> None:
    """The Overview's stacked bars: legend domain and colours are the catalogue's finest parts
    (sub-parts where a part has them: waiting vs transfer, idle causes), in its order."""
    pytest.importorskip("streamlit")
    import json
    import sys

    from streamlit.testing.v1 import AppTest

    monkeypatch.setattr(sys, "argv", ["app.py", "--store", str(tiny_store.root)])
    at = AppTest.from_file(str(PACKAGE / "dashboard" / "app.py"), default_timeout=120)
    at.run()
    at.switch_page("views/overview.py")
    at.run()
    for section in ("gpu_breakdown", "host_breakdown"):  # drawn when opened
        at.session_state[section] = True
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    scales = []
    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        scale = spec.get("encoding", {}).get("color", {}).get("scale", {})
        if "domain" in scale:
            scales.append((scale["domain"], scale["range"]))
    for breakdown in (GPU, HOST):
        expected = ([p.label for p in breakdown.leaves()], [p.color for p in breakdown.leaves()])
        assert expected in scales, (breakdown.name, scales)


# ---- the docs ----------------------------------------------------------------------------------


def doc_table(breakdown: Breakdown) -> str:
    """The Markdown table of a breakdown's parts, sub-parts and hidden parts (docs/ANALYSIS.md)."""
    def row(e: Part | Hidden, kind: str) -> str:
        metric = f"`{e.budget_metric}`" if isinstance(e, Part) and e.budget_metric else ""
        cells = [f"`{e.column}`", kind, e.label, metric, e.definition.replace("|", "\\|")]
        return "| " + " | ".join(cells) + " |"

    lines = ["| column | kind | label | budget metric | time where |", "|---|---|---|---|---|"]
    for p in breakdown.parts:
        lines.append(row(p, "part"))
        lines += [row(s, f"sub-part of `{p.column}`") for s in p.sub_parts]
    lines += [row(h, "hidden, not in the sum") for h in breakdown.hidden]
    return "\n".join(lines)


def _between_markers(text: str, name: str) -> re.Match[str] | None:
    return re.search(rf"(<!-- parts:{name} [^\n]*-->\n)(.*?)(\n<!-- /parts:{name} -->)", text, re.S)


def test_analysis_doc_tables_are_generated_from_the_catalogue(request: pytest.FixtureRequest) -> None:
    """docs/ANALYSIS.md holds each breakdown's table between ``<!-- parts:NAME -->`` markers;
    ``pytest --update-golden`` rewrites them from the catalogue."""
    path = DOCS / "ANALYSIS.md"
    update = request.config.getoption("--update-golden")
    text = path.read_text(encoding="utf-8")
    for breakdown in BREAKDOWNS:
        match = _between_markers(text, breakdown.name)
        assert match, f"docs/ANALYSIS.md has no <!-- parts:{breakdown.name} ... --> table"
        expected = doc_table(breakdown)
        if update:
            text = text[: match.start(2)] + expected + text[match.end(2):]
        else:
            assert match.group(2) == expected, (f"the {breakdown.name} parts table of docs/ANALYSIS.md is not the "
                                                f"catalogue's; run pytest --update-golden. Expected:\n{expected}")
    if update:
        path.write_text(text, encoding="utf-8")


def _backticked(text: str) -> list[str]:
    """Names in backticks, ``a`` and ``a, b`` alike, in order."""
    return [name.strip() for group in re.findall(r"`([a-z_0-9, ]+)`", text) for name in group.split(",")]


def test_contract_docs_name_every_part_and_metric() -> None:
    from stepscope.analysis.compare.budgets import BUDGET_METRICS

    summary = (DOCS / "SUMMARY_JSON.md").read_text(encoding="utf-8")
    steps = re.search(r"### `ranks\[\]\.steps\[\]`(.*?)\n\*\*Invariant", summary, re.S)
    assert steps
    documented = {k for k in _backticked(steps.group(1)) if k.endswith("_ns")} - {
        "dur_ns", "start_ns", "end_ns", "cpu_dur_ns"}
    assert documented == {*GPU.all_columns, *HOST.all_columns}
    invariant = re.search(r"\*\*Invariant:\*\*(.*?)==", summary, re.S)
    assert invariant and re.findall(r"\b\w+_ns\b", invariant.group(1)) == list(GPU.columns)

    compare = (DOCS / "COMPARE_JSON.md").read_text(encoding="utf-8")
    section = re.search(r"## Metrics\n(.*?)\n## ", compare, re.S)
    assert section
    rows = re.findall(r"^\| (`[^|]*`) \|", section.group(1), re.M)
    assert [name for row in rows for name in _backticked(row)] == list(BUDGET_METRICS)
    ci = (DOCS / "ci.md").read_text(encoding="utf-8")
    metrics = re.search(r"Metrics: `([^`]*)`", ci)
    assert metrics and [m.strip() for m in metrics.group(1).split(",")] == list(BUDGET_METRICS)


# ---- nobody else lists parts -----------------------------------------------------------------


def _identifiers() -> dict[str, str]:
    """What a hand-written list of parts would contain: columns, labels of several words, budget
    metric names with an underscore (single words like "compute" or "optimizer" are also
    categories and phases, so they prove nothing alone)."""
    found: dict[str, str] = {}
    for breakdown in BREAKDOWNS:
        for e in breakdown.entries():
            found[e.column] = "column"
            if " " in e.label:
                found[e.label] = "label"
        found.update({m: "budget metric" for m in breakdown.budget_metrics() if "_" in m})
    return found


def _strings(tree: ast.AST) -> list[ast.Constant]:
    """String constants of a module that are code, not documentation (docstrings and bare
    string statements are skipped)."""
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [n for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def hand_listed_parts(source: str) -> dict[str, int]:
    """Part identifiers a module's code spells out (identifier -> line), when there are two or
    more of them: one is a consumer using a part, two or more is a list kept by hand."""
    names = _identifiers()
    columns = re.compile(r"\b(" + "|".join(sorted((n for n, k in names.items() if k == "column"), key=len,
                                                   reverse=True)) + r")\b")
    found: dict[str, int] = {}
    for node in _strings(ast.parse(source)):
        for column in columns.findall(node.value):
            found.setdefault(column, node.lineno)
        if names.get(node.value) in ("label", "budget metric"):
            found.setdefault(node.value, node.lineno)
    return found if len(found) >= 2 else {}


def test_the_hand_listing_scan_can_fail() -> None:
    hand_written = '''
"""A docstring may name compute_ns and idle_ns."""
PARTS = {"compute_ns": "compute", "comm_exposed_ns": "exposed communication"}
'''
    assert hand_listed_parts(hand_written) == {"compute_ns": 3, "comm_exposed_ns": 3, "exposed communication": 3}
    assert hand_listed_parts('COLUMN = "compute_ns"\n') == {}  # one part, used
    assert hand_listed_parts('LABELS = ["exposed memsets", "GPU idle"]\n')
    assert hand_listed_parts('METRICS = ("memset_exposed", "comm_exposed")\n')


def test_no_module_lists_parts_by_hand() -> None:
    catalogue = PACKAGE / "store" / "rankstats" / "parts.py"
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != catalogue and (found := hand_listed_parts(path.read_text(encoding="utf-8"))):
            offenders[str(path.relative_to(REPO))] = found
    assert not offenders, f"derive these from stepscope.store.rankstats.parts instead: {offenders}"


# ---- analyses are imported, not looked up by name ----------------------------------------------


@pytest.mark.parametrize("folder", ["dashboard", "analysis/compare", "render", "commands"])
def test_no_analysis_is_looked_up_by_name(folder: str) -> None:
    """``importlib``/``getattr`` by string turn a renamed analysis into a silent "not available";
    these layers import what they call (a rename fails at import)."""
    for path in (PACKAGE / folder).rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert "importlib" not in names and "import_module" not in names, f"{path}: {ast.unparse(node)}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "analysis":
                assert not (node.args and isinstance(node.args[0], ast.Constant)), (
                    f"{path}:{node.lineno}: pass the imported function, not its name")
