"""``stepscope report RUN --store DIR --out report.html [--baseline NAME|RUN]``: one self-contained
HTML file (charts inlined, no network needed to view) with the run's overview and findings and,
given ``--baseline``, the comparison with it; for CI artifacts and sharing. A baseline that does
not exist yet (the first run of a branch) is said on the page, which then shows the run alone."""

from __future__ import annotations

import argparse
from pathlib import Path
from stepscope.store.location import store_location


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", nargs="+", help="run id, store folder (DIR or DIR::RUN) or trace folder; several: "
                                               "runs of the same code, compared together (the page shows the first)")
    parser.add_argument("--store", type=store_location, help="store folder or URL (s3://bucket/prefix)")
    parser.add_argument("--out", type=Path, required=True, help="HTML file to write")
    parser.add_argument("--baseline", help="baseline name or run to compare with")
    parser.add_argument("--fail-on", action="append", default=[], metavar="METRIC:+N%", help="budget (as compare)")
    parser.add_argument("--config", type=Path, help="stepscope.toml or pyproject.toml (as compare)")


def run(args: argparse.Namespace) -> int:
    from stepscope.analysis.absent import Absent
    from stepscope.analysis.breakdown import host_breakdown, step_breakdown
    from stepscope.analysis.compare.gate import NO_BASELINE
    from stepscope.analysis.compare.metrics import run_facts
    from stepscope.store.rankstats.parts import GPU, HOST
    from stepscope.analysis.summary import build_summary
    from stepscope.commands._runs import resolved
    from stepscope.commands.compare import gate
    from stepscope.render import html_report
    from stepscope.render.compare_json import to_json
    from stepscope.render.compare_tables import run_line, tables
    from stepscope.store import open_store

    with resolved(args.run[:1], args.store) as (ref,), open_store(ref.store) as store:
        bundle = _javascript(store.cache_root)
        summary = build_summary(store, ref.run)
        breakdown, parts = step_breakdown(store, ref.run), GPU.parts
        overview = [run_line(run_facts(store, ref.run).to_json())]
        charts = []
        if isinstance(breakdown, Absent):  # a CPU run: where the host's time goes instead
            gpu_reason = breakdown.reason
            breakdown, parts = host_breakdown(store, ref.run), HOST.parts
            if not isinstance(breakdown, Absent):
                overview.append(f"step breakdown: the host's (no GPU breakdown: {gpu_reason})")
        if not isinstance(breakdown, Absent):
            charts.append(html_report.breakdown_chart(breakdown.to_pylist(), parts))
        else:
            overview.append(f"step breakdown: not available ({breakdown.reason})")
        page_tables = []
        findings = summary["findings"]
        if args.baseline:
            comparison, verdict = gate(args.baseline, args.run, args.store, args.fail_on, args.config, None,
                                       missing_baseline="pass")
            doc = to_json(comparison, verdict)
            if verdict.status == NO_BASELINE:
                overview.append(f"not compared: {'; '.join(verdict.reasons)}")
            else:
                overview.append(f"compared with baseline {doc['baseline']['run']}: {doc['verdict']['status']}")
                overview += [f"  {r}" for r in doc["verdict"]["reasons"]]
                charts.append(html_report.comparison_chart(doc["metrics"]))
                page_tables = tables(doc)
                findings = findings + doc["findings"]
    page = html_report.render_report(f"stepscope report: {ref.run}", overview, findings, charts, page_tables, bundle)
    args.out.write_text(page, encoding="utf-8")
    print(f"wrote {args.out} ({len(page) / 1e6:.1f} MB, self-contained)")
    return 0


BUNDLE_CACHE = "report-js"
"""Folder under ``<store>/cache/`` that keeps the charts' JavaScript per vl-convert version."""


def _javascript(cache_root: Path) -> str:
    """The charts' JavaScript (vega, vega-lite, vega-embed), kept in the store's cache
    (``Store.cache_root``: this machine's folder for a store on object storage): building
    it takes vl-convert seconds, and a CI store sees a report per job. A store that cannot be
    written just means it is built each time."""
    from stepscope.render import html_report
    from stepscope.store.atomic import write_text_atomic

    path = cache_root / "cache" / BUNDLE_CACHE / f"{html_report.bundle_key()}.js"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    bundle = html_report.javascript_bundle()
    try:
        write_text_atomic(path, bundle)
    except OSError:
        pass
    return bundle
