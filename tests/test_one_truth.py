"""One screen, one truth: on every shared trace and every sample run, each finding's time and
share agree with the verdict's step (the one basis, the mean step), no share exceeds 100%, the
parts of the step add up to it, and what a trace cannot tell is absent with its reason.

The figures are read back from the summary document and from the text of its messages (what a
user reads), and checked against the step windows of the breakdown they are shares of.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.breakdown import host_breakdown, step_breakdown
from stepscope.analysis.summary import build_summary
from stepscope.store import open_store
from tests._intervals import length, union
from tests.conftest import REPO, SHARED_TRACES

NOT_KINETO = ("execution_details.json", "_et.json.gz", "memory_timeline.raw.gz", ".pickle")
TRACES = sorted(p.relative_to(SHARED_TRACES).as_posix() for p in SHARED_TRACES.rglob("*")
                if p.is_file() and p.name.endswith((".json", ".json.gz")) and not p.name.endswith(NOT_KINETO)
                and p.parent.name != "LICENSES") if SHARED_TRACES.is_dir() else []
SAMPLES = sorted(p.name for p in (REPO / "sample_traces").iterdir() if p.is_dir())

_UNITS = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}
_QUOTED = re.compile(r"([\d.,]+) (ns|us|ms|s) per step[^(]*\((\d+)% of the mean step")
"""``18.5 ms per step (64% of the mean step``: a time per step and its share, as messages state them."""


def _windows(store: Any, run: str) -> list[int]:
    gpu = step_breakdown(store, run)
    table = gpu if hasattr(gpu, "num_rows") and gpu.num_rows else host_breakdown(store, run)
    return table.column("dur_ns").to_pylist() if hasattr(table, "num_rows") else []


def check_one_truth(store: Any, run: str) -> None:
    doc = build_summary(store, run)
    v = doc["verdict"]
    windows = _windows(store, run)
    if not windows:
        assert v["basis"] is None and v["step_ns"] is None and v["absent_reasons"]["step_ns"]
        for f in v["findings"]:
            assert f["share_of_step"] is None
        return
    step = sum(windows) / len(windows)
    basis = v["basis"]
    assert basis["step_ns"] == v["mean_step_ns"] == round(step) and basis["windows"] == len(windows)
    assert basis["min_ns"] == min(windows) and basis["max_ns"] == max(windows)
    # the parts of the step: of the basis, never more than it
    assert sum(b["ns"] for b in v["bound_by"]) <= round(step) + len(v["bound_by"])
    for b in v["bound_by"]:
        assert 0 <= b["share"] <= 1 and abs(b["ns"] - b["share"] * step) <= 1 + 5e-5 * step, b
    for f in v["findings"]:
        stake = f["time_at_stake_ns"]
        if stake is None:
            assert f["share_of_step"] is None
            continue
        assert f["share_of_step"] == round(stake / step, 4), f
        assert 0 <= f["share_of_step"] <= 1, f
        for number, unit, pct in _QUOTED.findall(f["message"]):
            ns = float(number.replace(",", "")) * _UNITS[unit]
            assert abs(int(pct) - 100 * ns / step) <= 0.5 + 100 * 0.005 * ns / step, (f["message"], step)
    assert doc["findings"] == v["findings"]
    # data loading: known only where the trace records the DataLoader
    for rank in doc["ranks"]:
        for s in rank["steps"] or []:
            host = s["host"]
            if host["data_loading_ns"] is None:
                assert "DataLoader" in host["absent_reasons"]["data_loading_ns"]


@pytest.mark.shared
@pytest.mark.slow
@pytest.mark.parametrize("relative", TRACES)
def test_findings_agree_with_the_step_on_every_shared_trace(relative: str, ingested) -> None:
    store = open_store(ingested(relative))
    check_one_truth(store, "t")


@pytest.mark.slow
@pytest.mark.parametrize("sample", SAMPLES)
def test_findings_agree_with_the_step_on_every_sample(sample: str, sample_run) -> None:
    check_one_truth(open_store(sample_run(sample)), sample)


def test_a_run_without_steps_gets_a_whole_trace_verdict(shared_traces: Path, ingested) -> None:
    """param/resnet_kineto: no ProfilerStep. Its one window is the span of its GPU work (raw
    JSON: first kernel/copy start to the last end), busy 4.73 s of 14.5 s; the rest is idle the
    host left (every gap ends at work launched after it began)."""
    from tests.conftest import load_raw

    doc = build_summary(open_store(ingested("param/resnet_kineto.json.gz")), "t")
    v = doc["verdict"]
    assert v["basis"] is None and "ProfilerStep" in v["absent_reasons"]["step_ns"]
    whole = v["whole_trace"]
    gpu = [e for e in load_raw(shared_traces / "param/resnet_kineto.json.gz")["traceEvents"]
           if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X"]
    span_us = max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)
    assert whole["span_ns"] == pytest.approx(span_us * 1000, abs=1000)
    shares = {b["part"]: b["share"] for b in whole["bound_by"]}
    busy_us = length(union([(e["ts"], e["ts"] + e["dur"]) for e in gpu if e["dur"] > 0]))
    assert sum(c["share"] for c in whole["idle_causes"]) == pytest.approx(1 - busy_us / span_us, abs=1e-3)
    assert shares["idle_host_wait"] > 0.6 and "prof.step()" in whole["how_to_mark_steps"]
    from stepscope.commands.summary import render_table

    screen = render_table(doc, width=160)
    assert "whole trace: over the 14.5 s its GPU work spans" in screen and "steps were not marked" in screen


@pytest.mark.shared
@pytest.mark.parametrize("relative, loaders", [("hta/trace_diff/control/control.json.gz", True),
                                               ("tracelens/mi300/resnet_act_checkpoint.json.gz", False)])
def test_data_loading_is_absent_where_no_dataloader_is_recorded(relative: str, loaders: bool, ingested,
                                                                shared_traces: Path) -> None:
    """control records one enumerate(DataLoader)# per step; the MI300 trace none (raw JSON): there
    data loading is absent with its reason, in the steps and in the gpu.idle evidence, never 0."""
    from tests.conftest import load_raw

    raw = load_raw(shared_traces / relative)["traceEvents"]
    recorded = any(str(e.get("name", "")).startswith("enumerate(DataLoader)#") for e in raw)
    assert recorded == loaders
    doc = build_summary(open_store(ingested(relative)), "t")
    for step in doc["ranks"][0]["steps"]:
        value = step["host"]["data_loading_ns"]
        assert (value is not None) == loaders
        if not loaders:
            assert "enumerate(DataLoader)" in step["host"]["absent_reasons"]["data_loading_ns"]
    for f in doc["findings"]:
        if f["rule"] == "gpu.idle" and not loaders:
            assert f["evidence"]["data_loading_ns_per_step"] is None
