"""Fuzzing every input stepscope reads: a seeded, CI-sized run of the campaign, and the corpus.

The campaign itself (10,000 cases) is ``benchmarks/fuzz_campaign.py``; here Hypothesis draws a few
dozen mutated traces from a fixed seed (``derandomize``: the same cases on every run) and each
must pass the oracle (``tests/fuzz_oracle.py``); a failure shrinks to a short program of edits.
Every defect the campaign found is a minimal input under ``tests/corpus/`` with the outcome it
must have now (``<file>.expect``: ``ingested`` or ``refused: <words of the line>``).
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz_snapshots import check_snapshot, materialize_snapshot, snapshot_cases, snapshot_seeds
from tests.fuzz_mutations import SAMPLE_SEEDS, Case, apply_op, cases, materialize, seed_paths
from tests.fuzz_oracle import (
    Outcome,
    cli_check,
    invariant_failures,
    reason_class,
    run_case,
    snapshot,
    template_store,
    _refusal_failures,
)

CORPUS = Path(__file__).resolve().parent / "corpus"
CI_CASES = 12
"""Cases of the seeded run: what fits in the suite's minute (the campaign runs thousands)."""


@functools.lru_cache(maxsize=1)
def _work() -> tuple[Path, Path]:
    """One work folder and one template store (the ``base`` run) for the session's cases."""
    work = Path(tempfile.mkdtemp(prefix="stepscope-fuzz-test-"))
    return work, template_store(work)


def _judge(case: Case, *, dashboard: bool = False) -> Outcome:
    work, template = _work()
    name, data = materialize(case)
    return run_case(name, data, work / "case", template, dashboard=dashboard)


@pytest.mark.timeout(300)
@settings(max_examples=CI_CASES, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases(seeds=seed_paths()))
def test_mutated_traces_ingest_or_are_refused_in_one_line(case: Case) -> None:
    outcome = _judge(case)
    assert not outcome.failures, f"{case.describe()}\n{outcome.failures}"


def _corpus() -> list[Path]:
    return sorted(p for p in CORPUS.glob("*") if p.suffix in (".json", ".gz", ".pickle"))


def test_the_corpus_is_there() -> None:
    files = _corpus()
    assert files, "tests/corpus/ holds no inputs"
    for path in files:
        assert Path(f"{path}.expect").is_file(), f"{path.name}: no .expect beside it"


@pytest.mark.parametrize("path", _corpus(), ids=lambda p: p.name)
def test_corpus_case_has_its_outcome(path: Path) -> None:
    """Each input that once crashed, hung or broke an invariant now passes, with its outcome."""
    work, template = _work()
    outcome = run_case(path.name, path.read_bytes(), work / "corpus", template)
    assert not outcome.failures, outcome.failures
    expect = Path(f"{path}.expect").read_text().strip()
    if expect == "ingested":
        assert outcome.kind == "ingested", outcome.line
    else:
        assert expect.startswith("refused: "), expect
        assert outcome.kind == "refused", "ingested, expected a refusal"
        assert expect[len("refused: "):] in outcome.line, outcome.line


@pytest.mark.slow
def test_a_mutated_trace_through_the_command_line(tmp_path: Path) -> None:
    """The real ``stepscope ingest`` and ``summary --format json`` on two cases: one that ingests
    (a step annotation inside another) and one refused (a gzip stream cut short)."""
    seed = SAMPLE_SEEDS[0]
    for case, code in ((Case(seed, (("nested_step", 0, 0),), "compact", ("json", 0), ()), 0),
                       (Case(seed, (), "compact", ("gz-cut", 200), ()), 3)):
        name, data = materialize(case)
        path = tmp_path / str(code) / name
        path.parent.mkdir()
        path.write_bytes(data)
        assert cli_check(path, tmp_path / f"store{code}") == []


@pytest.mark.slow
def test_every_dashboard_page_on_a_mutated_trace() -> None:
    pytest.importorskip("streamlit")
    case = Case(SAMPLE_SEEDS[1], (("duplicate", 5, 3), ("devices_on_pid", 2)), "indented", ("gz", 0), ())
    outcome = _judge(case, dashboard=True)
    assert outcome.kind == "ingested" and outcome.dashboard, outcome.line
    assert not outcome.failures, outcome.failures


# ---- the oracle can fail ----

def test_the_oracle_catches_broken_invariants() -> None:
    step = {"step": 1, "dur_ns": 100, "compute_ns": 60, "comm_exposed_ns": 10, "memcpy_h2d_exposed_ns": 0,
            "memcpy_d2h_exposed_ns": 0, "memcpy_d2d_exposed_ns": 0, "memcpy_other_exposed_ns": 0,
            "memset_exposed_ns": 0, "idle_ns": 20, "idle_host_wait_ns": 5, "idle_kernel_wait_ns": 5,
            "idle_other_ns": 10}
    doc = {"ranks": [{"rank": 0, "steps": [step]}], "verdict": {"bound_by": [{"share": 0.6}, {"share": 0.5}]},
           "totals": {"comm_comp_overlap_pct": 140.0}}
    problems = invariant_failures(doc)
    assert any("sum to 90, not dur_ns = 100" in p for p in problems), problems
    assert any("shares sum to 1.1" in p for p in problems), problems
    assert any("comm_comp_overlap_pct = 140.0" in p for p in problems), problems
    step["idle_ns"] = 30
    step["idle_other_ns"] = 20
    doc["verdict"]["bound_by"] = [{"share": 0.6}]
    doc["totals"]["comm_comp_overlap_pct"] = 40.0
    assert invariant_failures(doc) == []


def test_the_oracle_catches_bad_refusals(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    assert _refusal_failures([f"{path}: not valid JSON"], [], path) == []
    assert _refusal_failures([f"{path}: internal error (KeyError: 'x')"], [], path)
    assert _refusal_failures([f"{path}: a", f"{path}: b"], [], path)
    assert _refusal_failures(["not the file: x"], [], path)
    assert reason_class(f"{path}: ts 1e300 at event 3 is out of range (x)", path) == "ts N at event N is out of range"
    (tmp_path / "s").mkdir()
    before = snapshot(tmp_path / "s")
    (tmp_path / "s" / "f").write_bytes(b"x")
    assert snapshot(tmp_path / "s") != before


def test_every_edit_applies_to_every_seed() -> None:
    """Each kind of edit runs on real seeds without failing in the harness itself, deterministically."""
    kinds = [("drop", 3, 2), ("duplicate", 3, 2), ("swap", 1, 7), ("reverse", 2, 5), ("shuffle", 9),
             ("set_field", 4, "ts", 3), ("set_arg", 4, "correlation", 4), ("del_field", 4, "ph"),
             ("negative_dur", 4, 5), ("nest_args", 4, 64), ("top_del", "traceEvents"),
             ("top_set", "distributedInfo.rank", 0), ("top_extra", "x", 1), ("replace_doc", 2),
             ("dangling_correlation", 3, -1), ("dangling_flow", 3, "s", 0), ("nested_step", 0, 1),
             ("devices_on_pid", 3), ("event_not_object", 2, 0), ("bulk_duplicate", 2)]
    for seed in seed_paths()[1:3]:
        for op in kinds:
            materialize(Case(seed, (op,), "compact", ("gz", 0), (("cut_token", 17, 1),)))
    case = Case(seed_paths()[0], tuple(kinds), "indented", ("gz-multi", 0), (("flip", 99, 3),))
    assert materialize(case) == materialize(case)
    assert apply_op([], ("drop", 0, 1)) == []


SNAPSHOT_CASES = 15


@pytest.mark.timeout(300)
@settings(max_examples=SNAPSHOT_CASES, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_mutated_memory_snapshots_are_read_or_refused_in_one_line(data: st.DataObject) -> None:
    """The memory-snapshot reader on mutated real snapshots (../shared/traces/memsnap)."""
    if not snapshot_seeds():
        pytest.skip("../shared/traces/memsnap is not present")
    case = data.draw(snapshot_cases())
    work, _ = _work()
    path = work / "snapshot.pickle"
    path.write_bytes(materialize_snapshot(case))
    kind, failures, _ = check_snapshot(path)
    assert not failures, f"{case.describe()}\n{failures}"
