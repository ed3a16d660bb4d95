"""``stepscope summary``: where each step's time goes, per rank, with the findings.

``--format json`` prints the documented contract (docs/SUMMARY_JSON.md); ``table`` and
``markdown`` render the same document. Rendering is pure: document in, string out.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from stepscope.commands._section_blocks import SECTION_BLOCKS, ns_cell
from stepscope.errors import UsageError
from stepscope.render.table import Column, Table, terminal_width, to_markdown, to_terminal
from stepscope.units import duration, for_key, format_value, percent
from stepscope.store.location import store_location

if TYPE_CHECKING:
    from stepscope.store.rankstats.parts import Breakdown

FORMATS = ("table", "json", "markdown")

Block = tuple[str, list[str], list[list[str]]]
"""(title, column names, rows of cells): the unit both text renderers draw."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, type=store_location, help="store folder or URL (s3://bucket/prefix)")
    parser.add_argument("--run", help="run name or id (default: the store's only run)")
    parser.add_argument("--rank", type=int, action="append", metavar="R",
                        help="only this rank (repeat for several)")
    parser.add_argument("--format", choices=FORMATS, default="table")
    parser.add_argument("--section", action="append", metavar="NAME",
                        help="after the verdict, also this section's tables (repeat for several); the first "
                             "screen lists the run's sections")
    parser.add_argument("--verbose", action="store_true", help="after the verdict, every section's tables")


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
    from stepscope.analysis.cache import cached_json_text
    from stepscope.analysis.summary import build_summary, summary_args
    from stepscope.store import open_store

    with open_store(args.store) as store:
        run_id = resolve_run(store, args.run)
        if args.format == "json" and not args.section:  # --section only checks its names here
            kept = cached_json_text(store, "summary", run_id, summary_args(args.rank))
            if kept is not None:  # answered from the cache: reformatted, never parsed
                print(indented_json(kept))
                return 0
        doc = build_summary(store, run_id, args.rank)
    sections = _chosen_sections(doc, args.section, args.verbose)
    if args.format == "json":
        print(indented_json(json.dumps(doc)))
    elif args.format == "markdown":
        print(render_markdown(doc, sections, full_names=args.verbose))
    else:
        print(render_table(doc, terminal_width(), sections, full_names=args.verbose))
    return 0


def indented_json(compact: str | bytes) -> str:
    """``compact`` JSON laid out as ``json.dumps(doc, indent=1)`` lays out ``doc`` (the printed
    contract), byte for byte: numbers and strings are copied as the C encoder wrote them, only
    the white space is redone (msgspec, in C; Python's own indented encoder is pure Python, most
    of a warm 1,024-rank summary). What msgspec cannot read (a NaN) is laid out by Python."""
    import msgspec

    try:
        laid_out = msgspec.json.format(compact, indent=1)
    except msgspec.DecodeError:
        return json.dumps(json.loads(compact), indent=1)
    return laid_out.decode() if isinstance(laid_out, bytes) else laid_out


def known_sections(doc: dict[str, Any]) -> tuple[str, ...]:
    """The sections of this summary document that ``--section`` can ask for, in its order."""
    return tuple(k for k in doc if k not in _RESERVED or k in ("ranks", "findings"))


def _chosen_sections(doc: dict[str, Any], asked: list[str] | None, verbose: bool) -> tuple[str, ...]:
    """The sections whose tables follow the verdict: every one with ``--verbose``, those asked
    for with ``--section`` (an unknown name is a usage error naming the known ones)."""
    known = known_sections(doc)
    if verbose:
        return known
    for name in asked or ():
        if name not in known:
            raise UsageError(f"--section {name}: no such section; sections: {', '.join(known)}")
    return tuple(asked or ())


# ---- rendering ----


def _share(part: Any, whole: Any) -> str:
    """``part`` as a percentage of ``whole`` (``n/a`` when either is missing)."""
    return format_value(100 * part / whole if part is not None and whole else None, "pct")


def _cell(value: Any, key: str = "", origin: float | None = None, full_names: bool = False) -> str:
    """A value of a section's JSON in human units by its key (:func:`stepscope.units.for_key`):
    durations, sizes, rates, hex addresses, times since the run's start, names shortened
    (whole with ``--verbose``); objects as JSON."""
    if isinstance(value, dict) or isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return json.dumps(value)
    return for_key(key, value, origin, full_names)


def _table_columns(breakdown: Breakdown) -> list[tuple[str, str]]:
    """(header, key) of a breakdown's terminal columns: each part followed by its sub-parts, then
    the hidden parts, where the catalogue (:mod:`stepscope.store.rankstats.parts`) gives a header."""
    entries = [*breakdown.with_sub_parts(), *breakdown.hidden]
    return [(e.short, e.column) for e in entries if e.short]


def _rank_blocks(rank: dict[str, Any]) -> Iterator[Block]:
    from stepscope.store.rankstats.parts import GPU, HOST

    step_columns, host_columns = _table_columns(GPU), _table_columns(HOST)
    r = rank["rank"]
    reasons = rank.get("absent_reasons", {})
    steps = rank.get("steps")
    if steps is None:
        yield (f"rank {r}: steps", ["absent"], [[reasons.get("steps", "")]])
    else:
        gpu = any(s.get(GPU.columns[0]) is not None for s in steps)  # GPU parts are null without GPU events
        if gpu:
            cols = ["step", "step time"] + [c for c, _ in step_columns]
            rows = [[str(s["step"]), ns_cell(s["dur_ns"])] + [_share(s[k], s["dur_ns"]) for _, k in step_columns] for s in steps]
            yield (f"rank {r}: GPU time per step (% of step; parts sum to 100%)", cols, rows)
        cols = ["step", "host time"] + [c for c, _ in host_columns]
        rows = [[str(s["step"]), ns_cell(s["host"]["dur_ns"])] + [_share(s["host"][k], s["host"]["dur_ns"]) for _, k in host_columns]
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
                   ["gpu span", "idle", "compute", "non-compute", "comm/comp overlap"],
                   [[ns_cell(span), _share(totals["gpu_idle_ns"], span), _share(totals["compute_ns"], span),
                     _share(totals["non_compute_ns"], span), format_value(overlap, "pct")]])
    stats = rank.get("step_stats")
    if stats:
        yield (f"rank {r}: step times (profiler_steps: the ProfilerStep CPU windows; step_times: the collector's "
               "wall time of every step; the verdict's basis is the mean step window)",
               ["source", "steps", "median", "p90", "min", "max", "spread"],
               [[s["source"], str(s["steps"]), ns_cell(s["median_ns"]), ns_cell(s["p90_ns"]), ns_cell(s["min_ns"]),
                 ns_cell(s["max_ns"]), format_value(s["spread_pct"], "pct")] for s in stats])


def _scalar(value: Any) -> bool:
    """A cell: a scalar, or a non-empty list of scalars (ranks, steps)."""
    if isinstance(value, list):
        return bool(value) and all(not isinstance(v, (dict, list)) for v in value)
    return not isinstance(value, dict)


_UNIT_SUFFIXES = ("_ns", "_bytes", "_gbps")


def _header(key: str) -> str:
    """A column's header: its key without the unit suffix its cells now spell out."""
    for suffix in _UNIT_SUFFIXES:
        if key.endswith(suffix) and key != suffix[1:]:
            return key.removesuffix(suffix)
    return key


def _generic_blocks(title: str, value: Any, origin: float | None = None, full_names: bool = False) -> Iterator[Block]:
    """Any section's JSON as blocks, in human units by key: lists of objects become tables (the
    ``run`` column left out: the first line names the run), objects key/value rows."""
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        cols: list[str] = []
        for v in value:
            cols.extend(k for k in v if k not in cols and k not in ("run", "absent_reasons") and _scalar(v[k]))
        yield (title, [_header(c) for c in cols], [[_cell(v.get(c), c, origin, full_names) for c in cols] for v in value])
        yield from _why_absent(title, value)
    elif isinstance(value, dict):
        scalars = [[_header(k), _cell(v, k, origin, full_names)] for k, v in value.items()
                   if _scalar(v) and k != "absent_reasons"]
        scalars += [[f"{k} (absent)", why] for k, why in value.get("absent_reasons", {}).items()]
        if scalars:
            yield (title, ["key", "value"], scalars)
        for k, v in value.items():
            if not _scalar(v) and k != "absent_reasons" and v:
                yield from _generic_blocks(f"{title}: {k}", v, origin, full_names)
    elif isinstance(value, list):
        if value:
            yield (title, ["value"], [[_cell(v)] for v in value])
    else:
        yield (title, ["value"], [[_cell(value)]])


def _why_absent(title: str, rows: list[dict[str, Any]]) -> Iterator[Block]:
    """The distinct reasons the rows' n/a cells carry, once each (a reason per cell would bury the table)."""
    reasons = sorted({(k, why) for r in rows for k, why in (r.get("absent_reasons") or {}).items()})
    if reasons:
        yield (f"{title}: why n/a", ["key", "reason"], [[k, why] for k, why in reasons])


_RESERVED = ("summary_version", "run", "ranks", "findings", "verdict", "absent_reasons")


def blocks(doc: dict[str, Any], sections: tuple[str, ...] | None = None, full_names: bool = False) -> Iterator[Block]:
    """The summary's sections as blocks, in document order, findings last (``sections``: only
    those; None: every one; ``full_names``: kernel and op names whole, as ``--verbose`` shows them)."""
    origin = (doc.get("verdict") or {}).get("run", {}).get("start_ns")

    def wanted(name: str) -> bool:
        return sections is None or name in sections

    if wanted("ranks"):
        for rank in doc.get("ranks") or []:
            yield from _rank_blocks(rank)
    for key, value in doc.items():
        if key in _RESERVED or not wanted(key):
            continue
        if value is None:
            yield (key, ["absent"], [[doc.get("absent_reasons", {}).get(key, "")]])
        else:
            special = SECTION_BLOCKS.get(key)
            yield from special(key, value, origin) if special else _generic_blocks(key, value, origin, full_names)
    if wanted("findings"):
        findings = doc.get("findings") or []
        yield ("findings", ["severity", "rule", "ranks", "at stake", "finding"],
               [[f["severity"], f["rule"], ", ".join(map(str, f.get("ranks") or [])) or "-",
                 duration(f["time_at_stake_ns"]) if f.get("time_at_stake_ns") is not None else "-", f["message"]]
                for f in findings] or [["-", "-", "-", "-", "no findings"]])


FIRST_SCREEN_FINDINGS = 8
"""Findings on the first screen; the rest are one ``--section findings`` away."""


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _run_line(doc: dict[str, Any]) -> str:
    v = doc["verdict"]
    facts = v.get("run") or {}
    world = f" of {facts['world_size']}" if facts.get("world_size") else ""
    backend = f", {facts['backend']}" if facts.get("backend") else ""
    if facts.get("gpu_name"):
        gpu = f", {facts['gpu_name']}" + (f" x{facts['gpu_count']}" if facts.get("gpu_count") else "")
    else:
        gpu = ", GPU model not recorded" if v.get("breakdown") == "gpu" else ", no GPU"
    return f"run {facts.get('name') or doc['run']}: {_n(facts.get('ranks') or 0, 'rank')} traced{world}{backend}{gpu}"


def _basis_line(v: dict[str, Any]) -> str:
    """The step basis, named: what every share and per-step figure of the screen is of."""
    b = v["basis"]
    where = "GPU time" if v["breakdown"] == "gpu" else "host time: no GPU events"
    spread = "" if b["min_ns"] == b["max_ns"] else \
        f"; median {duration(b['median_ns'])}, steps {duration(b['min_ns'])} to {duration(b['max_ns'])}"
    return (f"step time {duration(b['step_ns'])}: the mean step over {_n(v['ranks'], 'rank')} x {_n(v['steps'], 'step')}, "
            f"the basis of every share and per-step figure below ({where}{spread})")


def _whole_trace_lines(v: dict[str, Any]) -> list[str]:
    """A run without steps: what the device did over its traces, and how to mark steps."""
    whole = v.get("whole_trace")
    if not whole:
        return []
    return [f"whole trace: {whole['statement']}", whole["how_to_mark_steps"]]


def verdict_tables(doc: dict[str, Any]) -> tuple[list[str], list[Table]]:
    """The first screen: the run and its step basis in lines, then what bounds the step and the
    top findings (untruncated, with their time at stake) as tables."""
    v = doc["verdict"]
    lines = [_run_line(doc)]
    if v.get("basis") is None:
        lines.append(f"no step time: {v.get('absent_reasons', {}).get('step_ns', 'no steps')}")
        lines += _whole_trace_lines(v)
    else:
        lines.append(_basis_line(v))
    corrections = v.get("clock_corrections") or []
    if corrections:
        lines.append(f"clocks aligned on rank {corrections[0]['reference_rank']}'s from the end times of matched "
                     "collectives: " + ", ".join(f"rank {c['rank']} {'+' if c['ns'] > 0 else '-'}{duration(abs(c['ns']))}"
                                                  for c in corrections[:8])
                     + (f" and {len(corrections) - 8} more" if len(corrections) > 8 else ""))
    out: list[Table] = []
    if v.get("bound_by"):
        out.append(Table("What bounds the step", (Column("part"), Column("share", "pct"), Column("per step", "ns")),
                         [(b["label"], 100 * b["share"], b["ns"]) for b in v["bound_by"]]))
    elif (v.get("whole_trace") or {}).get("bound_by"):
        whole = v["whole_trace"]
        rows = [(b["label"], 100 * b["share"], b["ns"]) for b in whole["bound_by"]]
        out.append(Table("Where the traced time went (no steps: over each trace's span)",
                         (Column("part"), Column("share", "pct"), Column("time", "ns")), rows))
    findings = v.get("findings") or []
    shown = findings[:FIRST_SCREEN_FINDINGS]
    more = len(findings) - len(shown)
    note = f"{more} more: --section findings" if more > 0 else None

    def share(f: dict[str, Any]) -> str:  # a mean per step, of the basis step
        value = f.get("share_of_step")
        return percent(100 * value) if value is not None else "n/a"

    out.append(Table(
        "Findings, by time at stake per step",
        (Column("#", "count"), Column("at stake", "ns"), Column("of step"), Column("finding")),
        [(i + 1, f.get("time_at_stake_ns"), share(f), f"{f['message']}{_replayed(f)} [{f['rule']}]")
         for i, f in enumerate(shown)]
        or [(None, None, "", "no findings" + (" per step: the run has no steps" if v.get("basis") is None else ""))],
        note))
    return lines, out


def _replayed(finding: dict[str, Any]) -> str:
    """`` (at stake if 'rank 2: on time', replayed ± 76 ns)``: where a finding's time at stake
    comes from the replay (stepscope.analysis.stakes), the change and the error bar."""
    evidence = finding.get("evidence") or {}
    if evidence.get("stake_from") != "replay":
        return ""
    changes = " + ".join(f"'{c}'" for c in evidence.get("stake_change", []))
    return f" (at stake if {changes}, replayed ± {duration(evidence.get('stake_error_ns') or 0)})"


def _hint(doc: dict[str, Any]) -> str:
    return f"per rank and per section: --section NAME ({', '.join(known_sections(doc))}) or --verbose"


def tables(doc: dict[str, Any], sections: tuple[str, ...] | None = None, full_names: bool = False) -> list[Table]:
    """The summary's sections as tables of the one table model, in document order."""
    return [Table.of_text(title, cols, rows) for title, cols, rows in blocks(doc, sections, full_names)]


def first_screen(doc: dict[str, Any], width: int | None = None) -> str:
    """The verdict screen as plain text: what ``stepscope summary`` and ``stepscope demo`` print first."""
    lines, first = verdict_tables(doc)
    return "\n".join(lines) + "\n\n" + to_terminal(first, width)


def render_table(doc: dict[str, Any], width: int | None = None, sections: tuple[str, ...] = (),
                 full_names: bool = False) -> str:
    """Plain text for the terminal: the verdict screen, then the sections asked for."""
    text = first_screen(doc, width)
    if sections:
        return text + "\n\n" + to_terminal(tables(doc, sections, full_names), width)
    return text + "\n\n" + _hint(doc)


def render_markdown(doc: dict[str, Any], sections: tuple[str, ...] = (), full_names: bool = False) -> str:
    """Markdown (for CI comments and reports): the verdict, then the sections asked for."""
    lines, first = verdict_tables(doc)
    out = [f"# stepscope summary: run `{doc['run']}`", "", *(f"{line}  " for line in lines), ""]
    out += [to_markdown(t, level=2) for t in first]
    out += [to_markdown(t, level=2) for t in tables(doc, sections, full_names)] if sections else [f"_{_hint(doc)}_"]
    return "\n".join(out).rstrip()
