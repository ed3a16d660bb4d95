"""Identical runs never fail: 20 self-comparisons of the project's CPU sample runs (each ingested
twice, compared with every budget at zero and no floor), and 10 pairs of fresh recordings of the
same small CPU loop with the default budgets and floors (never a regression; one run a side may be
inconclusive, saying the noise was not measured)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from stepscope.analysis.compare.budgets import BUDGET_METRICS, UNITS_BY_DIMENSION
from stepscope.cli import main
from tests.conftest import REPO

SAMPLES = sorted(p for p in (REPO / "sample_traces").iterdir() if p.is_dir())
ZERO_UNIT = {dimension: next(iter(units)) for dimension, units in UNITS_BY_DIMENSION.items()}


def _strictest() -> list[str]:
    """Every metric at a zero threshold in its bad direction, and every floor at zero."""
    args = []
    for metric, dimension in BUDGET_METRICS.items():
        sign = "-" if dimension == "gbps" else "+"
        args += ["--fail-on", f"{metric}:{sign}0%", "--floor", f"{metric}:0{ZERO_UNIT[dimension]}"]
    return args


@pytest.fixture(scope="module")
def twice_ingested(tmp_path_factory: pytest.TempPathFactory, sample_run) -> dict[str, tuple[Path, Path]]:
    """Each sample run ingested into two separate stores (the first is the session's shared one)."""
    from stepscope.store.ingest import ingest_paths

    out = {}
    for folder in SAMPLES:
        again = tmp_path_factory.mktemp(f"{folder.name}-again")
        assert ingest_paths([folder], again, folder.name).ok
        out[folder.name] = (sample_run(folder.name), again)
    return out


@pytest.mark.parametrize("round_", range(10))
@pytest.mark.parametrize("sample", [p.name for p in SAMPLES])
def test_a_sample_run_never_fails_against_itself(twice_ingested: dict[str, tuple[Path, Path]], sample: str,
                                                 round_: int, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = twice_ingested[sample]
    base, cand = (first, second) if round_ % 2 == 0 else (second, first)
    code = main(["compare", f"{base}::{sample}", f"{cand}::{sample}", "--format", "json", *_strictest()])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["verdict"]["status"] == "pass", doc["verdict"]
    judged = [b for b in doc["budgets"] if b["status"] != "not_available"]
    assert judged, "nothing was compared"
    for b in judged:
        assert (b["status"], b["decided_by"], b["delta"]) == ("pass", "threshold", 0), b


@pytest.mark.slow  # beside other tests: load may make a pair inconclusive, never a regression
def test_fresh_recordings_of_the_same_loop_never_fail(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import stepscope
    from stepscope.analysis.compare import DEFAULT_BUDGETS, compare_runs, parse_budgets, verdict
    from stepscope.store import open_store

    torch.set_num_threads(1)  # pinned, as docs/ci.md says for CPU benchmarks
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    data = torch.randn(16, 64)
    def record(store: Path, run: str) -> None:
        with stepscope.profile(store=store, run=run, wait=0, warmup=1, active=8, convert="thread") as prof:
            for _ in range(9):
                model(data).sum().backward()
                prof.step()

    record(tmp_path / "warm-up", "w")  # the process's first profile pays one-time costs: not judged
    for i in range(20):  # each pair in a store of its own: the queries glob fewer files
        record(tmp_path / f"pair{i // 2}", f"r{i % 2}")
    outcomes, worst_pct, lowest_p = Counter(), 0.0, 1.0
    for pair in range(10):
        with open_store(tmp_path / f"pair{pair}") as s:
            comparison = compare_runs(s, "r0", s, "r1")
        result = verdict(comparison, parse_budgets(list(DEFAULT_BUDGETS)))
        # one run a side cannot show the run-to-run noise: the gate may say so (inconclusive, the
        # assumed noise named), but it never calls unchanged code a regression
        assert result.status in ("pass", "inconclusive"), result.reasons
        assert all("noise not measured" in reason for reason in result.reasons), result.reasons
        for r in result.results:
            outcomes[(r.budget.metric, r.decided_by)] += 1
        step = comparison.metric("step_time")
        assert step.source == "step_times.cpu_ns" and step.increase is not None and step.decrease is not None
        worst_pct = max(worst_pct, abs(step.delta_pct or 0))
        lowest_p = min(lowest_p, step.increase.p_value, step.decrease.p_value)
    print(f"10 fresh pairs: worst step-time change {worst_pct:.1f}%, lowest p {lowest_p:.2g}, "
          f"decided by {dict(sorted(outcomes.items()))}")
