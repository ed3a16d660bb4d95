"""The Pipeline & FLOPs page shows the analysis layer's figures: stage rows, ideal, the finding."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")

from stepscope.analysis.pipeline import pipeline_analysis  # noqa: E402
from stepscope.store import open_store  # noqa: E402
from tests.conftest import copy_run  # noqa: E402
from tests.test_dashboard_apptest import assert_clean, open_page, table_with  # noqa: E402


def test_pipeline_page_on_the_slow_stage_run(sample_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "s"
    copy_run(sample_run("pp-1f1b-3stages-slow"), root, "pp-1f1b-3stages-slow", as_run="slow")
    at = open_page(root, "pipeline", monkeypatch, run="slow")
    assert_clean(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["schedule"] == "1f1b" and metrics["microbatches"] == "4" and metrics["ideal bubble"] == "33.3%"
    expected = pipeline_analysis(open_store(root), "slow").stage_table().to_pylist()
    shown = table_with(at, "rank", "stage", "busy_ms", "bubble_fraction")
    assert shown["rank"].tolist() == [r["rank"] for r in expected]
    assert shown["busy_ms"].tolist() == pytest.approx([r["busy_ns"] / 1e6 for r in expected])
    assert shown["bubble_fraction"].tolist() == pytest.approx([r["bubble_fraction"] for r in expected])
    assert any("stage 1 (rank 1)" in w.value for w in at.warning)
    mfu = table_with(at, "rank", "step", "flops", "achieved_tflops")
    assert len(mfu) == 3 and (mfu["flops"] > 0).all()
