"""The fuzz harness's oracle: what must hold for every input stepscope is handed.

Each input either ingests, or is refused with exactly one ``<file>: <problem>`` line (what
``stepscope ingest`` prints, exit code 3), never an ``internal error``; a refused file leaves the
store byte for byte as it was, and the store stays readable either way. When the input ingests,
what ``stepscope summary`` does (the document, ``--format json`` with strict JSON, the table and
Markdown renderings) runs without an exception, and the verdict's invariants hold: each step's
parts are non-negative and sum to the step exactly (GPU, idle causes, host), the verdict's shares
lie in [0, 1] and sum to at most 1, no percentage share above 100. Optionally every dashboard
page (Streamlit AppTest) renders without an exception.

Everything runs in this process, through the functions the CLI calls (``ingest_paths``,
``build_summary``, the renderers), so a case costs an ingest, not an interpreter start;
``cli_check`` runs the real command line on a sample. The peak memory of a case is measured
(Linux: ``/proc/self/clear_refs`` resets the high-water mark) against the configured ingest limit.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FUZZ_RUN = "fuzz"
MEMORY_MARGIN = 256 << 20
"""Python's own share of a case (the materialised input, msgspec's top-level values) beyond DuckDB's limit."""
PAGES = ("runs", "overview", "communication", "copies", "memory", "kernels", "pipeline", "compare", "sql")

GPU_PARTS = ("compute_ns", "comm_exposed_ns", "memcpy_h2d_exposed_ns", "memcpy_d2h_exposed_ns",
             "memcpy_d2d_exposed_ns", "memcpy_other_exposed_ns", "memset_exposed_ns", "idle_ns")
IDLE_PARTS = ("idle_host_wait_ns", "idle_kernel_wait_ns", "idle_other_ns")
HOST_PARTS = ("data_loading_ns", "optimizer_ns", "sync_wait_ns", "compute_ops_ns", "communication_ops_ns", "other_ns")
NOT_SHARES = ("spread_pct", "share_of_steps_pct")
"""``_pct`` keys that are not a share of a whole: a spread, and the top kernels' and ops' summed
durations over the step windows (docs/ANALYSIS.md: parallel streams and threads add up to more
than 100%)."""


@dataclass
class Outcome:
    """What one input did: ``ingested`` or ``refused`` (with the refusal's ``reason`` class), and
    every broken rule in ``failures`` (empty: the input passed)."""

    kind: str
    reason: str | None = None
    line: str | None = None
    failures: list[str] = field(default_factory=list)
    peak_bytes: int | None = None
    dashboard: bool = False


def reason_class(line: str, path: Path) -> str:
    """The refusal's problem with its particulars (numbers, quoted values, positions) removed, so
    that refusals can be counted by reason."""
    problem = line[len(f"{path}: "):] if line.startswith(f"{path}: ") else line
    problem = re.sub(r"\(.*", "", problem)
    problem = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", problem)
    problem = re.sub(r"-?\d[\d_.,e+]*", "N", problem)
    return " ".join(problem.split()[:9]).rstrip(":;,")


def snapshot(root: Path) -> dict[str, str]:
    """Every file under the store with its content hash."""
    if not root.exists():
        return {}
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _limit_bytes(text: str) -> int:
    number, unit = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?i?B)?\s*", text, re.IGNORECASE).groups()
    scale = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KIB": 2**10, "MIB": 2**20,
             "GIB": 2**30, "TIB": 2**40}[(unit or "").upper()]
    return int(float(number) * scale)


def memory_bound() -> int:
    """The configured ingest memory limit (``--memory-limit``'s default) plus Python's margin."""
    from stepscope.store.ingest import ingest_memory_limit

    return _limit_bytes(ingest_memory_limit()) + MEMORY_MARGIN


def _rss(field_name: str) -> int | None:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(rf"^{field_name}:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def check_file(path: Path, store: Path, *, dashboard: bool = False) -> Outcome:
    """Ingest ``path`` into ``store`` (as run ``fuzz``) and judge everything that follows."""
    from stepscope.store.ingest import ingest_paths

    before = snapshot(store)
    measured = _reset_peak()
    start_rss = _rss("VmRSS")
    failures: list[str] = []
    try:
        report = ingest_paths([path], store, FUZZ_RUN)
    except Exception as exc:  # noqa: BLE001 - the oracle reports, the CLI would print this
        return Outcome("crashed", failures=[f"ingest raised {type(exc).__name__}: {_cut(str(exc))}"])
    peak = _rss("VmHWM") if measured else None
    if peak is not None and start_rss is not None and peak - start_rss > memory_bound():
        failures.append(f"memory: peak {peak - start_rss:,} bytes over the case's start, bound {memory_bound():,}")
    if report.errors:
        outcome = Outcome("refused", line=report.errors[0], peak_bytes=peak)
        outcome.reason = reason_class(report.errors[0], path)
        failures += _refusal_failures(report.errors, report.stored, path)
        after = snapshot(store)
        if after != before:
            changed = sorted(set(after.items()) ^ set(before.items()))
            failures.append(f"store changed by a refused file: {changed[:4]}")
            failures += readable_failures(store)
        # else: the same bytes as before, as readable as they were
    else:
        outcome = Outcome("ingested", peak_bytes=peak)
        if len(report.stored) != 1:
            failures.append(f"one file, {len(report.stored)} outcomes")
        else:
            lost = {k for k in before if k not in snapshot(store) and not k.startswith("cache/")}
            if lost:
                failures.append(f"files stored before are gone: {sorted(lost)[:4]}")
            failures += summary_failures(store, report.stored[0].run)
            if dashboard and not failures:
                outcome.dashboard = True
                failures += dashboard_failures(store, report.stored[0].run)
    outcome.failures = failures
    return outcome


def _cut(text: str, n: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "..."


def _refusal_failures(errors: list[str], stored: list[Any], path: Path) -> list[str]:
    out = []
    if len(errors) != 1:
        out.append(f"{len(errors)} lines for one file: {errors[:3]}")
    line = errors[0]
    if not line.startswith(f"{path}: "):
        out.append(f"refusal does not start with the file: {_cut(line)}")
    if "internal error" in line or "Traceback" in line:
        out.append(f"internal error: {_cut(line)}")
    if "\n" in line or "\r" in line:
        out.append(f"refusal spans several lines: {_cut(line)}")
    if stored:
        out.append("refused and stored")
    return out


READ_TABLES = ("runs", "sources", "events", "steps")


def readable_failures(store: Path) -> list[str]:
    """The store opens and its tables read (when anything was ever stored in it)."""
    if not any((store / t).exists() for t in ("sources", "events")):
        return []  # nothing was ever stored: "no such store" is the truth
    from stepscope.store import open_store

    try:
        with open_store(store) as s:
            _read_tables(s)
    except Exception as exc:  # noqa: BLE001
        return [f"store unreadable: {type(exc).__name__}: {_cut(str(exc))}"]
    return []


def _read_tables(s: Any) -> None:
    for table in READ_TABLES:
        s.sql(f"SELECT count(*) AS n FROM {table}").to_pylist()


def summary_failures(store: Path, run: str) -> list[str]:
    """The store's tables read, ``stepscope summary --run RUN --format json|table|markdown`` runs
    and the verdict's invariants hold."""
    from stepscope.analysis.summary import build_summary
    from stepscope.commands.summary import render_markdown, render_table
    from stepscope.store import open_store

    try:
        with open_store(store) as s:
            try:
                _read_tables(s)
            except Exception as exc:  # noqa: BLE001
                return [f"store unreadable: {type(exc).__name__}: {_cut(str(exc))}"]
            doc = build_summary(s, run, None)
    except Exception as exc:  # noqa: BLE001
        return [f"summary raised {type(exc).__name__}: {_cut(str(exc))}"]
    failures = []
    try:
        json.loads(json.dumps(doc, indent=1, allow_nan=False))
    except (TypeError, ValueError) as exc:
        failures.append(f"summary --format json is not strict JSON: {_cut(str(exc))}")
    for render in (lambda d: render_table(d, 100, ()), render_markdown):
        try:
            render(doc)
        except Exception as exc:  # noqa: BLE001
            failures.append(f"summary rendering raised {type(exc).__name__}: {_cut(str(exc))}")
    return failures + invariant_failures(doc)


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _sum_check(where: str, obj: dict[str, Any], parts: tuple[str, ...], whole: str) -> list[str]:
    values = [obj.get(p) for p in parts]
    if obj.get(whole) is None or any(v is None for v in values):
        return []
    out = [f"{where}: {p} = {v} < 0" for p, v in zip(parts, values) if v < 0]
    if sum(values) != obj[whole]:
        out.append(f"{where}: parts {dict(zip(parts, values))} sum to {sum(values)}, not {whole} = {obj[whole]}")
    return out


def invariant_failures(doc: dict[str, Any]) -> list[str]:
    """The summary's invariants (docs/SUMMARY_JSON.md): exact part sums, shares within bounds."""
    out: list[str] = []
    for rank in doc.get("ranks") or []:
        for step in rank.get("steps") or []:
            where = f"rank {rank.get('rank')} step {step.get('step')}"
            out += _sum_check(where, step, GPU_PARTS, "dur_ns")
            out += _sum_check(where + " idle", step, IDLE_PARTS, "idle_ns")
            out += _sum_check(where + " comm", step, ("comm_wait_ns", "comm_transfer_ns"), "comm_exposed_ns")
            host = step.get("host")
            if isinstance(host, dict):
                out += _sum_check(where + " host", host, HOST_PARTS, "dur_ns")
            for key, value in step.items():
                if key.endswith("_ns") and _num(value) and value < 0 and key not in ("start_ns", "end_ns"):
                    out.append(f"{where}: {key} = {value} < 0")
    verdict = doc.get("verdict") or {}
    shares = [b.get("share") for b in verdict.get("bound_by") or []]
    for share in shares:
        if not _num(share) or not 0 <= share <= 1:
            out.append(f"verdict: share {share} outside [0, 1]")
    if all(_num(s) for s in shares) and sum(shares) > 1 + 1e-3:
        out.append(f"verdict: shares sum to {sum(shares)} > 1")
    out += _walk_shares(doc, "doc")
    return out


def _walk_shares(node: Any, where: str) -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str) and _num(value) and key.endswith("_pct") and key not in NOT_SHARES:
                if math.isnan(value) or not 0 <= value <= 100:
                    out.append(f"{where}.{key} = {value}: a share outside [0, 100]%")
            elif key in ("share", "bubble_fraction") and _num(value) and not 0 <= value <= 1:
                out.append(f"{where}.{key} = {value}: a fraction outside [0, 1]")
            else:
                out += _walk_shares(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            out += _walk_shares(item, f"{where}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        out.append(f"{where} = {node}")
    return out[:10]


def dashboard_failures(store: Path, run: str) -> list[str]:
    """Every dashboard page on the run, in Streamlit's AppTest: no exception, no error box."""
    from streamlit.testing.v1 import AppTest

    app = REPO / "stepscope" / "dashboard" / "app.py"
    failures = []
    saved = sys.argv
    sys.argv = ["app.py", "--store", str(store)]
    try:
        for page in PAGES:
            at = AppTest.from_file(str(app), default_timeout=300)
            at.query_params["run"] = run
            with contextlib.redirect_stderr(io.StringIO()):
                at.run()
                at.switch_page(f"views/{page}.py")
                at.run()
            problems = [e.value for e in at.exception] + [e.value for e in at.error]
            if problems:
                failures.append(f"dashboard page {page}: {_cut(str(problems))}")
    finally:
        sys.argv = saved
    return failures


def cli_check(path: Path, store: Path, timeout: float = 300) -> list[str]:
    """The real command line on one input: ``stepscope ingest`` then, when it stored the file,
    ``stepscope summary --format json``: exit 0 or 3, one ``<file>: <problem>`` line, no traceback."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "stepscope.cli", "ingest", str(path), "--store", str(store), "--run", FUZZ_RUN]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, errors="replace")
    failures = []
    lines = [line for line in done.stderr.splitlines() if line.strip() and "Warning" not in line]
    if "Traceback" in done.stderr or "internal error" in done.stderr:
        failures.append(f"cli ingest: {_cut(done.stderr)}")
    if done.returncode == 3:
        problems = [line for line in lines if line.startswith(f"{path}: ")]
        if len(problems) != 1:
            failures.append(f"cli ingest exit 3 without exactly one '<file>: <problem>' line: {lines[:3]}")
    elif done.returncode == 0:
        done = subprocess.run([sys.executable, "-m", "stepscope.cli", "summary", "--store", str(store), "--run",
                               FUZZ_RUN, "--format", "json"], capture_output=True, text=True, timeout=timeout,
                              env=env, errors="replace")
        if done.returncode != 0:
            failures.append(f"cli summary exit {done.returncode}: {_cut(done.stderr)}")
        else:
            try:
                json.loads(done.stdout, parse_constant=_no_constant)
            except ValueError as exc:
                failures.append(f"cli summary --format json: not strict JSON ({exc})")
    else:
        failures.append(f"cli ingest exit {done.returncode}: {_cut(done.stderr)}")
    return failures


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} in JSON")


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


TEMPLATE_SEED = "sample_traces/gloo-3ranks-even/rank0.pt.trace.json.gz"
"""The run every case's store already holds (``base``): a refused input must leave it as it was."""


def template_store(where: Path) -> Path:
    """A store holding the ``base`` run, copied for each case."""
    from stepscope.store.ingest import ingest_paths

    root = where / "template"
    if not (root / "sources").exists():
        report = ingest_paths([REPO / TEMPLATE_SEED], root, "base")
        assert report.ok, report.errors
    return root


def run_case(name: str, data: bytes, work: Path, template: Path | None, *, dashboard: bool = False) -> Outcome:
    """Write the input as ``work/in/<name>``, give it a fresh copy of ``template`` (or no store)
    and judge it; ``work`` is emptied first."""
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    (work / "in").mkdir(parents=True)
    path = work / "in" / name
    path.write_bytes(data)
    store = work / "store"
    if template is not None:
        shutil.copytree(template, store, ignore=shutil.ignore_patterns("cache"))
    return check_file(path, store, dashboard=dashboard)
