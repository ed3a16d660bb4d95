"""``stepscope summary``: where each step's time goes, per rank, with the findings.

``--format json`` prints the documented contract (docs/SUMMARY_JSON.md); ``table`` and
``markdown`` render the same document. Rendering is pure: document in, string out.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepscope.commands._section_blocks import SECTION_BLOCKS
from stepscope.errors import UsageError
from stepscope.render.table import Table, terminal_width, to_markdown, to_terminal

if TYPE_CHECKING:
    from stepscope.analysis.parts import Breakdown

FORMATS = ("table", "json", "markdown")

Block = tuple[str, list[str], list[list[str]]]
"""(title, column names, rows of cells): the unit both text renderers draw."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, type=Path, help="store folder")
    parser.add_argument("--run", help="run name or id (default: the store's only run)")
    parser.add_argument("--rank", type=int, action="append", metavar="R",
                        help="only this rank (repeat for several)")
    parser.add_argument("--format", choices=FORMATS, default="table")


def resolve_run(store: Any, run: str | None) -> str:
    """The run id for ``--run`` (an id or a name as given), or the only run of the store."""
    runs = store.sql("SELECT run, name FROM runs ORDER BY run").to_pylist()
    if not runs:
        raise UsageError(f"{store.root}: the store holds no runs (ingest traces first)")
    if run is None:
        if len(runs) == 1:
            return runs[0]["run"]
        raise UsageError("the store holds several runs; pick one with --run: "
                         + ", ".join(r["run"] for r in runs))
    for row in runs:
        if run in (row["run"], row["name"]):
            return row["run"]
    raise UsageError(f"no run {run!r} in {store.root}; runs: " + ", ".join(r["run"] for r in runs))


def run(args: argparse.Namespace) -> int:
    from stepscope.analysis.summary import build_summary
    from stepscope.store import open_store

    with open_store(args.store) as store:
        doc = build_summary(store, resolve_run(store, args.run), args.rank)
    if args.format == "json":
        print(json.dumps(doc, indent=1))
    elif args.format == "markdown":
        print(render_markdown(doc))
    else:
        print(render_table(doc, terminal_width()))
    return 0


# ---- rendering ----


def _ms(ns: Any) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.2f}"


def _pct(part: Any, whole: Any) -> str:
    if part is None or not whole:
        return "-"
    return f"{100 * part / whole:.1f}%"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def _table_columns(breakdown: Breakdown) -> list[tuple[str, str]]:
    """(header, key) of a breakdown's terminal columns: each part followed by its sub-parts, then
    the hidden parts, where the catalogue (:mod:`stepscope.analysis.parts`) gives a header."""
    entries = [*breakdown.with_sub_parts(), *breakdown.hidden]
    return [(e.short, e.column) for e in entries if e.short]


def _rank_blocks(rank: dict[str, Any]) -> Iterator[Block]:
    from stepscope.analysis.parts import GPU, HOST

    step_columns, host_columns = _table_columns(GPU), _table_columns(HOST)
    r = rank["rank"]
    reasons = rank.get("absent_reasons", {})
    steps = rank.get("steps")
    if steps is None:
        yield (f"rank {r}: steps", ["absent"], [[reasons.get("steps", "")]])
    else:
        gpu = any(s.get(GPU.columns[0]) is not None for s in steps)  # GPU parts are null without GPU events
        if gpu:
            cols = ["step", "dur ms"] + [c for c, _ in step_columns]
            rows = [[str(s["step"]), _ms(s["dur_ns"])] + [_pct(s[k], s["dur_ns"]) for _, k in step_columns] for s in steps]
            yield (f"rank {r}: GPU time per step (% of step; parts sum to 100%)", cols, rows)
        cols = ["step", "cpu ms"] + [c for c, _ in host_columns]
        rows = [[str(s["step"]), _ms(s["host"]["dur_ns"])] + [_pct(s["host"][k], s["host"]["dur_ns"]) for _, k in host_columns]
                for s in steps]
        yield (f"rank {r}: host time per step (% of ProfilerStep)", cols, rows)
    totals = rank.get("totals")
    if totals is not None:
        treasons = totals.get("absent_reasons", {})
        if totals.get("gpu_span_ns") is None:
            yield (f"rank {r}: totals", ["absent"], [[treasons.get("gpu_span_ns", "")]])
        else:
            span = totals["gpu_span_ns"]
            overlap = totals.get("comm_comp_overlap_pct")
            yield (f"rank {r}: whole trace (HTA definitions)",
                   ["gpu span ms", "idle", "compute", "non-compute", "comm/comp overlap"],
                   [[_ms(span), _pct(totals["gpu_idle_ns"], span), _pct(totals["compute_ns"], span),
                     _pct(totals["non_compute_ns"], span),
                     "-" if overlap is None else f"{overlap:.1f}%"]])
    stats = rank.get("step_stats")
    if stats:
        yield (f"rank {r}: step times",
               ["source", "steps", "median ms", "p90 ms", "min ms", "max ms", "spread"],
               [[s["source"], str(s["steps"]), _ms(s["median_ns"]), _ms(s["p90_ns"]), _ms(s["min_ns"]),
                 _ms(s["max_ns"]), f"{s['spread_pct']:.1f}%"] for s in stats])


def _generic_blocks(title: str, value: Any) -> Iterator[Block]:
    """Any section's JSON as blocks: lists of objects become tables, objects key/value rows."""
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        cols: list[str] = []
        for v in value:
            cols.extend(k for k in v if k not in cols and not isinstance(v[k], (dict, list)))
        yield (title, cols, [[_cell(v.get(c)) for c in cols] for v in value])
    elif isinstance(value, dict):
        scalars = [[k, _cell(v)] for k, v in value.items() if not isinstance(v, (dict, list)) and k != "absent_reasons"]
        scalars += [[f"{k} (absent)", why] for k, why in value.get("absent_reasons", {}).items()]
        if scalars:
            yield (title, ["key", "value"], scalars)
        for k, v in value.items():
            if isinstance(v, (dict, list)) and k != "absent_reasons":
                yield from _generic_blocks(f"{title}: {k}", v)
    elif isinstance(value, list):
        if value:
            yield (title, ["value"], [[_cell(v)] for v in value])
    else:
        yield (title, ["value"], [[_cell(value)]])


_RESERVED = ("summary_version", "run", "ranks", "findings", "absent_reasons")


def blocks(doc: dict[str, Any]) -> Iterator[Block]:
    """The whole summary as blocks, in document order; findings last."""
    for rank in doc.get("ranks") or []:
        yield from _rank_blocks(rank)
    for key, value in doc.items():
        if key in _RESERVED:
            continue
        if value is None:
            yield (key, ["absent"], [[doc.get("absent_reasons", {}).get(key, "")]])
        else:
            yield from SECTION_BLOCKS.get(key, _generic_blocks)(key, value)
    findings = doc.get("findings") or []
    yield ("findings", ["severity", "rule", "finding"],
           [[f["severity"], f["rule"], f["message"]] for f in findings] or [["-", "-", "no findings"]])


def tables(doc: dict[str, Any]) -> list[Table]:
    """The whole summary as tables of the one table model, in document order; findings last."""
    return [Table.of_text(title, cols, rows) for title, cols, rows in blocks(doc)]


def render_table(doc: dict[str, Any], width: int | None = None) -> str:
    """Plain-text rendering for the terminal."""
    return f"run {doc['run']}\n\n" + to_terminal(tables(doc), width)


def render_markdown(doc: dict[str, Any]) -> str:
    """Markdown rendering (for CI comments and reports)."""
    out = [f"# stepscope summary: run `{doc['run']}`", ""] + [to_markdown(t, level=2) for t in tables(doc)]
    return "\n".join(out).rstrip()
