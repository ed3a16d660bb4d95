"""Compare: the run against a baseline, metric by metric with deltas, and the kernels that moved."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from stepscope.dashboard._data import context
from stepscope.dashboard._view import GIB, NS_PER_MS, chart, data_table, guarded, shown

TOP = 20
UNIT_SCALE = {"ns": (NS_PER_MS, "ms"), "bytes": (GIB, "GiB"), "gbps": (1.0, "GB/s")}

ctx = context()
st.title("Compare")
with guarded("Compare"):
    comparison = ctx.compare()
    if shown(comparison, "Comparison"):
        st.caption(f"Baseline **{ctx.baseline}** against **{ctx.run}** (all ranks), one run each. Step time "
                   f"from `{comparison.step_source}` (wall time still shown); deltas compare each metric's "
                   f"statistic over the per-step values, the CPU runs' host parts included. With one run a side "
                   f"the run-to-run noise is not measured (the noise column says what is assumed), and the "
                   f"p-values, one-sided Mann-Whitney U tests over the runs' values, claim nothing.")
        for reason in comparison.not_comparable_reasons:
            st.warning(reason, icon=":material/warning:")

        rows = []
        for m in comparison.metrics:
            scale, unit = UNIT_SCALE.get(m.unit, (1.0, m.unit))
            test = m.increase if (m.delta or 0) > 0 else m.decrease
            noise = m.noise
            rows.append({
                "metric": m.label, "statistic": m.statistic, "unit": unit,
                "baseline": None if m.base_value is None else m.base_value / scale,
                "candidate": None if m.cand_value is None else m.cand_value / scale,
                "delta": None if m.delta is None else m.delta / scale,
                "delta_pct": m.delta_pct,
                "noise": None if noise is None else noise.margin / scale,
                "noise_measured": None if noise is None else noise.measured,
                "p_value": None if test is None else test.p_value,
                "absent_reason": m.absent_reason,
            })
        metrics = pd.DataFrame(rows)
        times = metrics[(metrics["unit"] == "ms") & metrics["baseline"].notna() & metrics["candidate"].notna()]
        if not times.empty:
            side = times.melt(id_vars=["metric", "delta", "delta_pct"], value_vars=["baseline", "candidate"],
                              var_name="run", value_name="ms")
            side["run"] = side["run"].map({"baseline": f"baseline {ctx.baseline}", "candidate": f"run {ctx.run}"})
            chart(alt.Chart(side, title="step time and its parts (median per step)").mark_bar().encode(
                y=alt.Y("metric:N", title=None, sort=list(times["metric"]), axis=alt.Axis(labelLimit=240, labelOverlap=False)),
                yOffset=alt.YOffset("run:N"),
                x=alt.X("ms:Q", title="median per step (ms)"),
                color=alt.Color("run:N", title=None, scale=alt.Scale(range=["#9ECAE9", "#4C78A8"])),
                tooltip=[alt.Tooltip("metric:N"), alt.Tooltip("run:N"), alt.Tooltip("ms:Q", title="ms", format=",.3f"),
                         alt.Tooltip("delta:Q", title="delta (ms)", format="+,.3f"),
                         alt.Tooltip("delta_pct:Q", title="delta (%)", format="+.1f")],
            ).properties(height=46 * len(times) + 30))
        data_table(metrics)

        st.subheader("Kernels that changed most (time per step)")
        kernels = comparison.kernels
        if shown(kernels, "Kernels"):
            table = pd.DataFrame([{
                "kernel": k.key, "status": k.status,
                "baseline_ms": None if k.baseline is None else k.baseline / NS_PER_MS,
                "candidate_ms": None if k.candidate is None else k.candidate / NS_PER_MS,
                "delta_ms": ((k.candidate or 0.0) - (k.baseline or 0.0)) / NS_PER_MS,
                "delta_pct": k.delta_pct, "baseline_count": k.baseline_count, "candidate_count": k.candidate_count,
            } for k in kernels if k.status != "same"])
            if table.empty:
                st.info("No kernel changed.")
            else:
                table = table.reindex(table["delta_ms"].abs().sort_values(ascending=False).index).head(TOP)
                chart(alt.Chart(table).mark_bar().encode(
                    x=alt.X("delta_ms:Q", title="change in time per step (ms)"),
                    y=alt.Y("kernel:N", title=None, sort=list(table["kernel"]), axis=alt.Axis(labelLimit=420, labelOverlap=False)),
                    color=alt.Color("status:N", title="status"),
                    tooltip=[alt.Tooltip("kernel:N"), alt.Tooltip("status:N"),
                             alt.Tooltip("baseline_ms:Q", title="baseline (ms/step)", format=",.4f"),
                             alt.Tooltip("candidate_ms:Q", title="candidate (ms/step)", format=",.4f"),
                             alt.Tooltip("delta_ms:Q", title="delta (ms/step)", format="+,.4f"),
                             alt.Tooltip("delta_pct:Q", title="delta (%)", format="+.1f")],
                ).properties(height=22 * len(table) + 40))
                data_table(table)

        for title, deltas, value, count in (
            ("Collectives by size bucket (bus bandwidth and count, median over ranks)", comparison.collectives, "busbw_gbps", "count"),
            ("Copies by direction and host memory (bandwidth and bytes, median over ranks)", comparison.copies, "bandwidth_gbps", "bytes"),
        ):
            with st.expander(title):
                if shown(deltas, title):
                    data_table(pd.DataFrame([{
                        "name": d.key, "status": d.status, f"baseline_{value}": d.baseline,
                        f"candidate_{value}": d.candidate, "delta_pct": d.delta_pct,
                        f"baseline_{count}": d.baseline_count, f"candidate_{count}": d.candidate_count,
                    } for d in deltas]))

        if comparison.findings:
            st.subheader("Findings")
            for f in comparison.findings:
                (st.warning if f.severity.value != "info" else st.info)(f.message)
        with st.expander("Comparability checks"):
            data_table(pd.DataFrame([c.to_json() for c in comparison.checks]).astype(str))
