"""Benchmark `stepscope ingest` against HTA's trace load and against a JSON-parsing floor.

Why: ingest is the first thing every user runs on a big trace; issue 20 sets targets relative
to the peer (HolisticTraceAnalysis) and to the cost of merely parsing the JSON:

- (a) in-process: stepscope's ingest at least 5x faster than HTA's ``TraceAnalysis`` load, and
  within 3x of the floor (read + gunzip + the fastest full JSON parse measured here, printed);
- (b) whole process (interpreter start and imports included): ``stepscope ingest`` at least 4x
  faster than ``python -c`` loading the trace with HTA;
- (c) peak RSS at most half of HTA's; store size (the Parquet tables) at most the .gz size;
- (d) flat memory: df_index_resolver's events repeated 5 times, each copy shifted by the trace's
  span (written to a temporary file), ingest with a peak RSS at most 1.3x the original's;
- (e) one small trace (``hta/trace_filter/sampled_rank-0``: 4,855 events of a real 128-rank NCCL
  job, the nearest shared trace to the issue's ~3,300) ingested in-process in at most 0.2 s;
- (g) ``--jobs 2`` on 8 files (hta/trace_diff/control as ranks 0..7) at least 1.7x faster than
  ``--jobs 1``;
- (h) 8 small ranks (the small trace of (e) as ranks 0..7) ingested, then summarised, as a user
  runs them (``stepscope ingest`` with its default jobs, then ``stepscope summary --format json``:
  two processes, interpreter start included) in at most 3 s together.

Every ratio is printed beside its target, and again in one summary at the end. For each trace
the time of each stage of one ingest is printed too (read and split with the staging overlapped,
the checks, each part and each rank table, the commit): the real ``ingest_paths``, its stages
timed by wrapping the functions it calls (``STAGES``), in a process of its own.

Every measured thing runs in its own fresh process (benchmarks/_measure.py), so each peak RSS is
that thing's own. The floor candidates are all printed; the fastest full parse is the floor.

HTA is optional: it runs from its own interpreter (env STEPSCOPE_HTA_PYTHON, ../hta-venv or
.hta-venv; see tests/hta_runner.py and .ci/install_hta.sh), because it must not go into the
project's environment. Without it the HTA rows and ratios say "skipped".

Run: python benchmarks/bench_ingest.py [--traces DIR] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from _measure import (
    REPO_ROOT,
    MeasureError,
    Measurement,
    format_table,
    median_measurement,
    run_process,
    run_snippet,
    shared_traces_dir,
    verdict,
)

sys.path.insert(0, str(REPO_ROOT))
from tests.hta_runner import find_hta_python  # noqa: E402  (the one place that knows where HTA is)

TRACES = ("hta/df_index_resolver", "hta/trace_diff/control")
"""Trace folders (relative to the shared traces) named by the store issue: 54 MB and 35 MB."""

RUN_NAME = "bench"

# Targets from the store issue. Ratios are "how many times better stepscope is" except where
# noted, so each reads naturally next to its target.
TARGET_INPROC_VS_HTA = 5.0  # HTA load time / stepscope ingest time, at least
TARGET_INPROC_VS_FLOOR = 3.0  # stepscope ingest time / floor time, at most
TARGET_PROCESS_VS_HTA = 4.0  # HTA process wall / stepscope CLI wall, at least
TARGET_RSS_VS_HTA = 0.5  # stepscope peak RSS / HTA peak RSS, at most
TARGET_STORE_VS_GZ = 1.0  # store Parquet bytes / .gz bytes, at most
TARGET_FLAT_RSS = 1.3  # peak RSS on the 5x trace / on the original, at most
TARGET_JOBS_SPEEDUP = 1.7  # --jobs 1 wall / --jobs 2 wall on 8 files, at least
TARGET_SMALL_S = 0.2  # one small trace, in-process ingest seconds, at most
TARGET_SMALL_RANKS_S = 3.0  # 8 small ranks: ingest process + summary process, wall seconds, at most
SMALL_RANKS = 8

FLAT_TRACE = "hta/df_index_resolver"
FLAT_COPIES = 5
JOBS_TRACE = "hta/trace_diff/control"
JOBS_FILES = 8
SMALL_TRACE = "hta/trace_filter/sampled_rank-0.json.gz"

SUMMARY: list[str] = []
"""Every ratio line printed, gathered for the summary at the end."""

_READ_GUNZIP = "DATA = zlib.decompress(open(PATH, 'rb').read(), 31)\n"
_READ_IGZIP = "DATA = isal_zlib.decompress(open(PATH, 'rb').read(), 31)\n"

# The typed decode that stepscope-style ingest can use: only the fields every event needs are
# decoded into a Struct; `args` stays raw JSON bytes (validated, not turned into dicts).
_TYPED_SETUP = """
import zlib, msgspec
class Event(msgspec.Struct):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    id: int | str | None = None
    args: msgspec.Raw = msgspec.Raw(b"null")
class Trace(msgspec.Struct):
    traceEvents: list[Event] = []
DECODER = msgspec.json.Decoder(Trace)
"""


@dataclass(frozen=True)
class Candidate:
    """One floor candidate: imports (not timed) and the timed read+decompress+parse."""

    label: str
    setup: str
    work: str
    module: str  # skipped with a note when this module is not importable
    full_parse: bool = True  # False for the decompress-only reference row


FLOOR_CANDIDATES = (
    Candidate(
        "floor: read + gunzip only (no parse)",
        "import zlib",
        _READ_GUNZIP + "RESULT = {'json_bytes': len(DATA)}",
        "zlib",
        full_parse=False,
    ),
    Candidate(
        "floor: gunzip + json.loads",
        "import zlib, json",
        _READ_GUNZIP + "RESULT = {'events': len(json.loads(DATA)['traceEvents'])}",
        "json",
    ),
    Candidate(
        "floor: gunzip + orjson.loads",
        "import zlib, orjson",
        _READ_GUNZIP + "RESULT = {'events': len(orjson.loads(DATA)['traceEvents'])}",
        "orjson",
    ),
    Candidate(
        "floor: gunzip + msgspec.json.decode",
        "import zlib, msgspec",
        _READ_GUNZIP + "RESULT = {'events': len(msgspec.json.decode(DATA)['traceEvents'])}",
        "msgspec",
    ),
    Candidate(
        "floor: gunzip + msgspec Struct, raw args",
        _TYPED_SETUP,
        _READ_GUNZIP + "RESULT = {'events': len(DECODER.decode(DATA).traceEvents)}",
        "msgspec",
    ),
    Candidate(
        "floor: igzip (isal) only (no parse)",
        "from isal import isal_zlib",
        _READ_IGZIP + "RESULT = {'json_bytes': len(DATA)}",
        "isal",
        full_parse=False,
    ),
    Candidate(
        "floor: igzip (isal) + msgspec Struct, raw args",
        _TYPED_SETUP + "from isal import isal_zlib",
        _READ_IGZIP + "RESULT = {'events': len(DECODER.decode(DATA).traceEvents)}",
        "isal",
    ),
    Candidate(
        "floor: gunzip + pysimdjson Parser.parse",
        "import zlib, simdjson\nPARSER = simdjson.Parser()",
        _READ_GUNZIP + "RESULT = {'events': len(PARSER.parse(DATA)['traceEvents'])}",
        "simdjson",
    ),
    Candidate(
        "floor: duckdb read_json (events as JSON)",
        "import duckdb\nCON = duckdb.connect()",
        "RESULT = {'events': CON.execute(\"SELECT len(traceEvents) FROM read_json(?, "
        "columns = {'traceEvents': 'JSON[]'}, maximum_object_size = 2000000000)\", "
        "[PATH]).fetchone()[0]}",
        "duckdb",
    ),
)


STAGES = """
import collections, time
from stepscope.store import atomic, dedupe, ingest, rankstats, sessions
from stepscope.store.rankstats import reduce
SPENT = collections.defaultdict(lambda: [0.0, 0.0])

def timed(owner, name, stage):
    fn = getattr(owner, name)
    def wrapper(*args, **kwargs):
        w, c = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            label = stage(*args) if callable(stage) else stage
            if label is not None:  # None: not a stage of its own (a call with nothing to do)
                spent = SPENT[label]
                spent[0] += time.perf_counter() - w
                spent[1] += time.process_time() - c
    setattr(owner, name, wrapper)

timed(ingest, "read_trace", "read, gunzip, split (staging overlapped, its CPU included)")
timed(ingest.Stager, "close", "staging: what was left after the split")
timed(dedupe, "same_trace", "duplicate check")
timed(ingest, "convert", "checks, steps, facts")
timed(ingest, "write_partition", lambda root, table, *rest: "part " + table)
timed(ingest.engine, "connect", "DuckDB connection")
timed(reduce, "present", "rank tables: what the trace holds")
timed(rankstats, "prepare", "rank tables: the shared sweeps")
def sharers(con, run, table, *rest):
    return ("rank tables: statements shared by " + ", ".join(t.name for t in rankstats.TABLES
                                                            if set(t.shared) & set(table.shared))
            if table.shared else None)

timed(reduce, "share", sharers)
timed(atomic.AtomicBatch, "place", "parts put in place (fsync together, rename)")
timed(sessions, "place", "commit: sessions and clashes")
"""
"""Setup of the stage breakdown: wraps what ``ingest_paths`` calls so each stage's wall and CPU
time add up in ``SPENT`` (the real code path, nothing copied)."""


def stage_breakdown(path: Path, label: str) -> None:
    """Print the time of each stage of one in-process ingest of ``path`` (a process of its own)."""
    with tempfile.TemporaryDirectory(prefix="stepscope-bench-") as tmp:
        try:
            m = run_snippet(STAGES, f"ingest.ingest_paths([{str(path)!r}], {str(Path(tmp) / 'store')!r}, run='b')\n"
                            "RESULT = {k: v for k, v in SPENT.items()}", label=label, env=_stepscope_env(),
                            cwd=REPO_ROOT)
        except MeasureError as exc:
            print(f"stage breakdown of {label}: failed ({str(exc).splitlines()[0]})")
            return
    spent: dict[str, list[float]] = m.result
    tables = {k: v for k, v in spent.items() if k.startswith("part rank_")}
    rows = [[k, _fmt(w), _fmt(c)] for k, (w, c) in spent.items() if k not in tables]
    rows.append(["rank tables: the parts, all " + str(len(tables)), _fmt(sum(w for w, _ in tables.values())),
                 _fmt(sum(c for _, c in tables.values()))])
    rows += [["  " + k.removeprefix("part "), _fmt(w), _fmt(c)]
             for k, (w, c) in sorted(tables.items(), key=lambda kv: -kv[1][1])]
    accounted = sum(c for _, c in spent.values())
    rows.append(["(everything else)", _fmt((m.work_s or 0) - sum(w for w, _ in spent.values())),
                 _fmt((m.work_cpu_s or 0) - accounted)])
    print(f"\n-- stages of one in-process ingest of {label}: {_fmt(m.work_s)} s wall, {_fmt(m.work_cpu_s)} s CPU --")
    print(format_table(["stage", "wall s", "CPU s"], rows))


def _importable(module: str, python: str | os.PathLike[str] = sys.executable) -> bool:
    probe = subprocess.run([os.fspath(python), "-c", f"import {module}"], capture_output=True)
    return probe.returncode == 0


def _stepscope_env() -> dict[str, str]:
    """The environment for stepscope children: the repo importable even when not installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def _dir_bytes(path: Path, *, exclude: str | None = None) -> int:
    return sum(
        f.stat().st_size
        for f in path.rglob("*")
        if f.is_file() and (exclude is None or exclude not in f.relative_to(path).parts)
    )


INGEST_IN_PROCESS = "stepscope ingest_paths (in-process)"
INGEST_CLI = "stepscope ingest CLI (whole process)"
HTA_IN_PROCESS = "HTA TraceAnalysis load (in-process)"
HTA_PROCESS = "HTA python -c load (whole process)"


@dataclass
class Row:
    """One table row: the medians over repeats of one measured thing, or why it was skipped."""

    label: str
    samples: list[Measurement]
    skipped: str | None = None

    @property
    def median(self) -> Measurement | None:
        return median_measurement(self.samples) if self.samples else None


class Bench:
    """Measures every thing for one trace, ``repeat`` times, interleaved to spread drift.

    The measuring process itself stays small (no decompression, no pyarrow here): on Linux a
    child's peak RSS can include the parent's (see benchmarks/_measure.py).
    """

    def __init__(self, trace_dir: Path, repeat: int, hta_python: Path | None, hta_note: str):
        self.trace_dir = trace_dir
        self.path = next(p for p in sorted(trace_dir.iterdir()) if p.name.endswith(".json.gz"))
        self.repeat = repeat
        self.hta_python = hta_python
        self.hta_note = hta_note
        self.rows: dict[str, Row] = {}
        self.store_bytes: list[int] = []
        self.originals_bytes = 0
        self.failures: list[str] = []

    def _measure(self, label: str, fn: Callable[[], Measurement]) -> None:
        row = self.rows[label]
        if row.skipped:
            return
        try:
            row.samples.append(fn())
        except MeasureError as exc:
            row.skipped = "failed: " + str(exc).splitlines()[0]
            self.failures.append(str(exc))

    def run(self, available: list[Candidate]) -> None:
        path_setup = f"PATH = {str(self.path)!r}\n"
        for c in FLOOR_CANDIDATES:
            why = None if c in available else f"skipped ({c.module} not installed)"
            self.rows[c.label] = Row(c.label, [], why)
        for label in (INGEST_IN_PROCESS, INGEST_CLI):
            self.rows[label] = Row(label, [])
        for label in (HTA_IN_PROCESS, HTA_PROCESS):
            self.rows[label] = Row(label, [], None if self.hta_python else f"skipped ({self.hta_note})")

        for _ in range(self.repeat):
            for c in available:
                self._measure(
                    c.label, lambda c=c: run_snippet(path_setup + c.setup, c.work, label=c.label)
                )
            self._measure(INGEST_IN_PROCESS, self._ingest_in_process)
            self._measure(INGEST_CLI, self._ingest_cli)
            self._measure(HTA_IN_PROCESS, self._hta_in_process)
            self._measure(HTA_PROCESS, self._hta_process)

    def _with_store(self, measure: Callable[[Path], Measurement]) -> Measurement:
        """Run one ingest into a fresh store, then record the size of what it wrote."""
        with tempfile.TemporaryDirectory(prefix="stepscope-bench-") as tmp:
            store = Path(tmp) / "store"
            m = measure(store)
            if not any((store / "events").rglob("*.parquet")):
                raise MeasureError(f"{m.label}: no events Parquet written under {store}")
            originals = store / "originals"
            self.store_bytes.append(_dir_bytes(store, exclude="originals"))
            self.originals_bytes = _dir_bytes(originals) if originals.exists() else 0
        return m

    def _ingest_in_process(self) -> Measurement:
        return self._with_store(
            lambda store: run_snippet(
                "from stepscope.store.ingest import ingest_paths",
                f"REPORT = ingest_paths([{str(self.path)!r}], {str(store)!r}, run={RUN_NAME!r})\n"
                "RESULT = {'events stored': sum(t.events for t in REPORT.stored)}",
                label=INGEST_IN_PROCESS,
                env=_stepscope_env(),
                cwd=REPO_ROOT,
            )
        )

    def _ingest_cli(self) -> Measurement:
        return self._with_store(
            lambda store: run_process(
                [sys.executable, "-m", "stepscope.cli", "ingest", str(self.path),
                 "--store", str(store), "--run", RUN_NAME, "--quiet"],
                label=INGEST_CLI,
                env=_stepscope_env(),
                cwd=REPO_ROOT,
            )
        )

    def _hta_in_process(self) -> Measurement:
        assert self.hta_python is not None
        return run_snippet(
            "from hta.trace_analysis import TraceAnalysis",
            f"T = TraceAnalysis(trace_dir={str(self.trace_dir)!r})\n"
            "RESULT = {'rows HTA keeps': sum(len(df) for df in T.t.traces.values())}",
            label=HTA_IN_PROCESS,
            python=self.hta_python,
        )

    def _hta_process(self) -> Measurement:
        assert self.hta_python is not None
        code = (
            "from hta.trace_analysis import TraceAnalysis; "
            f"TraceAnalysis(trace_dir={str(self.trace_dir)!r})"
        )
        return run_process([str(self.hta_python), "-c", code], label=HTA_PROCESS)


def _fmt(value: float | None, digits: int = 3) -> str | None:
    return None if value is None else f"{value:.{digits}f}"


def _note(result: object) -> str:
    if not isinstance(result, dict):
        return ""
    return ", ".join(f"{v / 1e6:.1f} MB JSON" if k == "json_bytes" else f"{v:,} {k}"
                     for k, v in result.items())


def summary_line(label: str, num: float | None, den: float | None, target: float, at_least: bool,
                 why_missing: str, cpu: tuple[float | None, float | None] = (None, None)) -> None:
    """Print one ratio beside its target (and in CPU time when given); keep it for the summary."""
    if num is None or den is None or den == 0:
        line = f"{label}: n/a ({why_missing})"
    else:
        line = verdict(label, num / den, target, at_least=at_least)
        if cpu[0] is not None and cpu[1]:
            line += f"  [in CPU time: {cpu[0] / cpu[1]:.2f}x]"
    print(line)
    SUMMARY.append(line)


def report(bench: Bench, name: str) -> None:
    """Print the table and the ratio lines for one trace."""
    gz_bytes = bench.path.stat().st_size
    print(f"\n== {name}: {bench.path.name}, {gz_bytes / 1e6:.2f} MB gzipped ==")
    rows = []
    for row in bench.rows.values():
        m = row.median
        if m is None:
            rows.append([row.label, None, None, None, None, None, None, row.skipped])
        else:
            imports_mb = None if m.setup_rss_bytes is None else m.setup_rss_bytes / 1e6
            rows.append([row.label, _fmt(m.work_s), _fmt(m.work_cpu_s), _fmt(m.wall_s),
                         _fmt(m.cpu_s), _fmt(m.peak_rss_mb, 0), _fmt(imports_mb, 0),
                         _note(m.result)])
    print(format_table(["thing", "in-process s", "(CPU s)", "whole process s", "(CPU s)",
                        "peak RSS MB", "(after imports)", "note"], rows))

    def med(label: str) -> Measurement | None:
        return bench.rows[label].median

    counts = {
        m.result["events"] for c in FLOOR_CANDIDATES
        if (m := med(c.label)) is not None and isinstance(m.result, dict) and "events" in m.result
    }
    ingested = med(INGEST_IN_PROCESS)
    if ingested is not None and isinstance(ingested.result, dict):
        counts.add(ingested.result["events stored"])
    if len(counts) > 1:
        print(f"WARNING: parsers and ingest disagree on the number of events: {sorted(counts)}")

    floors = [
        (m.work_s, c.label)
        for c in FLOOR_CANDIDATES
        if c.full_parse and (m := med(c.label)) is not None and m.work_s is not None
    ]
    floor_s, floor_label = min(floors) if floors else (None, "")
    if floor_s is not None:
        print(f"floor = fastest full parse: {floor_label.removeprefix('floor: ')}, {floor_s:.3f} s")

    ing, cli, hta_in, hta_proc = (med(x) for x in (INGEST_IN_PROCESS, INGEST_CLI, HTA_IN_PROCESS,
                                                    HTA_PROCESS))
    no_ing = "stepscope ingest did not run"
    no_hta = bench.rows[HTA_IN_PROCESS].skipped or no_ing

    def ratio_line(label: str, num: float | None, den: float | None, target: float,
                   at_least: bool, why_missing: str, cpu: tuple[float | None, float | None]
                   = (None, None)) -> None:
        summary_line(f"{name}: {label}", num, den, target, at_least, why_missing, cpu)

    floor_cpu = next((m.work_cpu_s for c in FLOOR_CANDIDATES
                      if c.label == floor_label and (m := med(c.label)) is not None), None)
    ratio_line("in-process speed: HTA load / stepscope ingest", hta_in and hta_in.work_s,
               ing and ing.work_s, TARGET_INPROC_VS_HTA, True, no_hta,
               (hta_in and hta_in.work_cpu_s, ing and ing.work_cpu_s))
    ratio_line("in-process: stepscope ingest / floor", ing and ing.work_s, floor_s,
               TARGET_INPROC_VS_FLOOR, False, no_ing, (ing and ing.work_cpu_s, floor_cpu))
    ratio_line("whole process speed: HTA python -c / stepscope ingest CLI",
               hta_proc and hta_proc.wall_s, cli and cli.wall_s, TARGET_PROCESS_VS_HTA, True,
               no_hta, (hta_proc and hta_proc.cpu_s, cli and cli.cpu_s))
    ratio_line("peak RSS, whole process: stepscope CLI / HTA", cli and cli.peak_rss_bytes,
               hta_proc and hta_proc.peak_rss_bytes, TARGET_RSS_VS_HTA, False, no_hta)
    ratio_line("peak RSS, in-process: stepscope ingest_paths / HTA load",
               ing and ing.peak_rss_bytes, hta_in and hta_in.peak_rss_bytes, TARGET_RSS_VS_HTA,
               False, no_hta)
    if bench.store_bytes:
        store = statistics.median(bench.store_bytes)
        summary_line(f"{name}: store size (Parquet tables) / .gz", store, gz_bytes, TARGET_STORE_VS_GZ,
                     False, no_ing)
        print(f"  [{store / 1e6:.2f} MB vs {gz_bytes / 1e6:.2f} MB]")
    else:
        summary_line(f"{name}: store size (Parquet tables) / .gz", None, None, TARGET_STORE_VS_GZ, False, no_ing)


def _cli_ingest(paths: list[Path], store: Path, *extra: str, label: str) -> Measurement:
    return run_process([sys.executable, "-m", "stepscope.cli", "ingest", *map(str, paths), "--store", str(store),
                        "--run", RUN_NAME, "--quiet", *extra], label=label, env=_stepscope_env(), cwd=REPO_ROOT,
                       timeout_s=1800)


def _make(snippet: str) -> None:
    """Run input-making code in a child (the measuring process stays small: see _measure.py)."""
    subprocess.run([sys.executable, "-c", "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n" + snippet,
                    str(REPO_ROOT / "benchmarks"), str(REPO_ROOT)], check=True, env=_stepscope_env())


def flat_memory(traces: Path, repeat: int, work: Path) -> None:
    """(d) the CLI's peak RSS on a trace of the original's events repeated 5x, against the original."""
    original = next(p for p in sorted((traces / FLAT_TRACE).iterdir()) if p.name.endswith(".json.gz"))
    repeated = work / f"x{FLAT_COPIES}.json.gz"
    _make(f"from _scale import repeat_trace; from pathlib import Path; "
          f"print(repeat_trace(Path({str(original)!r}), Path({str(repeated)!r}), {FLAT_COPIES}), 'events')")
    rows, peaks = [], {}
    for label, path in (("original", original), (f"{FLAT_COPIES}x repeated", repeated)):
        samples = []
        for k in range(repeat):
            samples.append(_cli_ingest([path], work / f"store-{len(peaks)}-{k}", label=label))
            shutil.rmtree(work / f"store-{len(peaks)}-{k}", ignore_errors=True)
        m = median_measurement(samples)
        peaks[label] = m.peak_rss_bytes
        rows.append([label, f"{path.stat().st_size / 1e6:.1f}", _fmt(m.wall_s), _fmt(m.cpu_s), _fmt(m.peak_rss_mb, 0)])
    print(f"\n== (d) flat memory: {FLAT_TRACE} and its events repeated {FLAT_COPIES}x (stepscope ingest CLI) ==")
    print(format_table(["trace", ".gz MB", "wall s", "CPU s", "peak RSS MB"], rows))
    summary_line(f"flat memory: peak RSS {FLAT_COPIES}x trace / original", peaks[f"{FLAT_COPIES}x repeated"],
                 peaks["original"], TARGET_FLAT_RSS, False, "ingest did not run")


def small_trace(traces: Path, repeat: int) -> None:
    """(e) one small trace ingested in-process (``SMALL_TRACE``), against ``TARGET_SMALL_S``."""
    path = traces / SMALL_TRACE
    if not path.is_file():
        summary_line("small trace: in-process ingest s", None, None, TARGET_SMALL_S, False, f"{SMALL_TRACE} missing")
        return
    samples = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="stepscope-bench-") as tmp:
            samples.append(run_snippet(
                "from stepscope.store.ingest import ingest_paths",
                f"REPORT = ingest_paths([{str(path)!r}], {str(Path(tmp) / 'store')!r}, run={RUN_NAME!r})\n"
                "RESULT = {'events stored': sum(t.events for t in REPORT.stored)}",
                label="small trace", env=_stepscope_env(), cwd=REPO_ROOT))
    m = median_measurement(samples)
    print(f"\n== (e) one small trace: {SMALL_TRACE} ({_note(m.result)}), in-process ==")
    print(format_table(["thing", "in-process s", "(CPU s)", "peak RSS MB"],
                       [["stepscope ingest_paths", _fmt(m.work_s), _fmt(m.work_cpu_s), _fmt(m.peak_rss_mb, 0)]]))
    line = verdict(f"small trace: in-process ingest of {SMALL_TRACE}", m.work_s or 0.0, TARGET_SMALL_S,
                   at_least=False, unit=" s")
    line += f"  [in CPU time: {m.work_cpu_s or 0:.2f} s]"
    print(line)
    SUMMARY.append(line)
    stage_breakdown(path, SMALL_TRACE)


def small_ranks(traces: Path, repeat: int, work: Path) -> None:
    """(h) ``SMALL_RANKS`` small ranks ingested by the CLI, then summarised by the CLI."""
    path = traces / SMALL_TRACE
    if not path.is_file():
        summary_line("8 small ranks: ingest + summary s", None, None, TARGET_SMALL_RANKS_S, False,
                     f"{SMALL_TRACE} missing")
        return
    folder = work / "small-ranks"
    _make(f"from _scale import rank_files; from pathlib import Path; "
          f"rank_files(Path({str(path)!r}), Path({str(folder)!r}), {SMALL_RANKS})")
    files = sorted(folder.iterdir())
    rows, totals = [], []
    for k in range(repeat):
        store = work / f"small-ranks-store-{k}"
        ingest = _cli_ingest(files, store, label="ingest")
        summary = run_process([sys.executable, "-m", "stepscope.cli", "summary", "--store", str(store),
                               "--format", "json"], label="summary", env=_stepscope_env(), cwd=REPO_ROOT,
                              timeout_s=600)
        shutil.rmtree(store, ignore_errors=True)
        totals.append(ingest.wall_s + summary.wall_s)
        rows.append([k + 1, _fmt(ingest.wall_s), _fmt(ingest.cpu_s), _fmt(summary.wall_s), _fmt(summary.cpu_s),
                     _fmt(totals[-1])])
    print(f"\n== (h) {SMALL_RANKS} small ranks ({SMALL_TRACE} as ranks 0..{SMALL_RANKS - 1}): "
          "stepscope ingest, then stepscope summary (two processes) ==")
    print(format_table(["run", "ingest wall s", "(CPU s)", "summary wall s", "(CPU s)", "together s"], rows))
    line = verdict(f"{SMALL_RANKS} small ranks: ingest + summary, two processes, median", statistics.median(totals),
                   TARGET_SMALL_RANKS_S, at_least=False, unit=" s")
    print(line)
    SUMMARY.append(line)


def parallel_jobs(traces: Path, repeat: int, work: Path) -> None:
    """(g) ``--jobs 2`` against ``--jobs 1`` on 8 files."""
    original = next(p for p in sorted((traces / JOBS_TRACE).iterdir()) if p.name.endswith(".json.gz"))
    folder = work / "ranks"
    _make(f"from _scale import rank_files; from pathlib import Path; "
          f"rank_files(Path({str(original)!r}), Path({str(folder)!r}), {JOBS_FILES})")
    files = sorted(folder.iterdir())
    rows, walls, cpus = [], {}, {}
    for _ in range(repeat):
        for jobs in (1, 2):
            store = work / f"jobs{jobs}"
            m = _cli_ingest(files, store, "--jobs", str(jobs), label=f"--jobs {jobs}")
            shutil.rmtree(store, ignore_errors=True)
            walls.setdefault(jobs, []).append(m.wall_s)
            cpus.setdefault(jobs, []).append(m.cpu_s or 0.0)
    for jobs in (1, 2):
        rows.append([f"--jobs {jobs}", _fmt(statistics.median(walls[jobs])), _fmt(statistics.median(cpus[jobs]))])
    print(f"\n== (g) {JOBS_FILES} files ({JOBS_TRACE} as ranks 0..{JOBS_FILES - 1}), stepscope ingest CLI ==")
    print(format_table(["jobs", "wall s", "CPU s (all processes)"], rows))
    summary_line("parallel: --jobs 1 wall / --jobs 2 wall", statistics.median(walls[1]),
                 statistics.median(walls[2]), TARGET_JOBS_SPEEDUP, True, "ingest did not run")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", help="shared traces folder (default: <repo>/../shared/traces)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per thing; medians are shown")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    traces = shared_traces_dir(args.traces)
    if traces is None:
        print(f"no shared traces at {args.traces or REPO_ROOT.parent / 'shared' / 'traces'}: "
              "nothing to benchmark")
        return 0
    missing = [t for t in TRACES if not (traces / t).is_dir()]
    if missing:
        print(f"{traces}: missing {', '.join(missing)}: nothing to benchmark")
        return 0

    hta_python = find_hta_python()
    hta_note = "" if hta_python else "no HTA interpreter: set STEPSCOPE_HTA_PYTHON or run .ci/install_hta.sh"
    if hta_python is not None and not _importable("hta.trace_analysis", hta_python):
        hta_python, hta_note = None, f"{find_hta_python()} cannot import hta.trace_analysis"
    print(f"stepscope ingest benchmark: {args.repeat} run(s) per thing, medians; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; python {sys.executable}")
    print("Targets are on wall time; CPU times (user + system) are shown too because they move "
          "less when the machine is shared.")
    print(f"HTA: {hta_python}" if hta_python else f"HTA: skipped ({hta_note})")
    available = [c for c in FLOOR_CANDIDATES if _importable(c.module)]

    failures = []
    for name in TRACES:
        bench = Bench(traces / name, args.repeat, hta_python, hta_note)
        bench.run(available)
        report(bench, name)
        stage_breakdown(bench.path, name)
        failures += bench.failures
    with tempfile.TemporaryDirectory(prefix="stepscope-bench-") as tmp:
        try:
            small_trace(traces, args.repeat)
            flat_memory(traces, args.repeat, Path(tmp))
            small_ranks(traces, args.repeat, Path(tmp))
            parallel_jobs(traces, args.repeat, Path(tmp))
        except MeasureError as exc:
            failures.append(str(exc))
    print(f"\n== every ratio beside its target (load average at the end: {os.getloadavg()[0]:.2f}) ==")
    print("\n".join(SUMMARY))
    for failure in failures:
        print(f"\nFAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
