"""The long fuzz campaign: N mutated traces through ingest, summary and (a sample) the dashboard.

    python benchmarks/fuzz_campaign.py --cases 10000 [--seed 26] [--workers 2] [--until 03:20]
    python benchmarks/fuzz_campaign.py --target snapshots --cases 1000

Hypothesis draws N cases (``tests/fuzz_mutations.py``: structure-aware edits of real traces,
containers, byte edits) from the seed given; each runs in a worker process through the oracle
(``tests/fuzz_oracle.py``) with a hang bound (``--timeout``, the worker is killed past it) and
its peak memory measured against the configured ingest limit. Every ``--dashboard-every``-th
ingested case also renders every dashboard page (AppTest), every ``--cli-every``-th case also runs
the real command line. Prints the cases tried, the outcomes, the refusals by reason and every
failure (crash, internal error, hang, memory, invariant); failing inputs are written under
``--save`` for the corpus (tests/corpus/). ``--until HH:MM`` (UTC) stops handing out cases then
and reports what ran; so do Ctrl-C and SIGTERM, at once.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from tests.fuzz_mutations import Case, cases, materialize  # noqa: E402


CHUNK = 200
"""Cases drawn at a time (Hypothesis run ``k`` of a campaign uses seed ``seed * 100_000 + k``):
drawing 10,000 at once took 8 minutes before the first case ran."""


def draw_cases(n: int, seed_value: int) -> list[Case]:
    """N cases drawn by Hypothesis from ``seed_value`` (generation only: the campaign records
    failures rather than stopping at the first; the suite's run shrinks them)."""
    drawn: list[Case] = []

    @seed(seed_value)
    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(cases())
    def collect(case: Case) -> None:
        drawn.append(case)

    collect()
    return drawn[:n]


class CaseStream:
    """The campaign's cases, drawn a chunk at a time as they are needed (deterministic)."""

    def __init__(self, n: int, seed_value: int) -> None:
        self.n, self.seed = n, seed_value
        self.cases: list[Case] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Case:
        while index >= len(self.cases):
            chunk = len(self.cases) // CHUNK
            self.cases += draw_cases(min(CHUNK, self.n - len(self.cases)), self.seed * 100_000 + chunk)
        return self.cases[index]


def _worker(conn: Connection, work: str) -> None:
    """Run cases sent down ``conn`` until it closes; answer each with its outcome."""
    from tests.fuzz_oracle import cli_check, run_case, template_store

    root = Path(work)
    template = template_store(root)
    conn.send(("ready", None))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        index, case, dashboard, cli = task
        start = time.perf_counter()
        name, data = materialize(case)
        outcome = run_case(name, data, root / "case", template, dashboard=dashboard)
        if cli and not outcome.failures:
            outcome.failures += cli_check(root / "case" / "in" / name, root / "cli-store")
            shutil.rmtree(root / "cli-store", ignore_errors=True)
        conn.send(("done", (index, outcome.kind, outcome.reason, outcome.line, outcome.failures,
                            outcome.peak_bytes, outcome.dashboard, cli, time.perf_counter() - start)))


class Worker:
    def __init__(self, ctx: Any, work: Path, number: int) -> None:
        self.work = work / f"w{number}"
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker, args=(child, str(self.work)), daemon=True)
        self.process.start()
        child.close()
        self.task: int | None = None
        self.started = 0.0
        self.ready = False
        self.budget = 0.0

    def send(self, index: int, payload: tuple[Any, ...]) -> None:
        self.task, self.started = index, time.monotonic()
        self.conn.send(payload)

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600,
                        help="hang bound, seconds: for a case's ingest and summary, and again for each "
                             "dashboard page and command-line call it runs")
    parser.add_argument("--dashboard-every", type=int, default=40, metavar="K",
                        help="every K-th ingested case also renders every dashboard page")
    parser.add_argument("--cli-every", type=int, default=100, metavar="M",
                        help="every M-th case also runs the real command line")
    parser.add_argument("--target", choices=("traces", "snapshots"), default="traces",
                        help="what to mutate: Kineto traces through ingest (default), or memory snapshots "
                             "through the snapshot reader (in this process: it is plain Python)")
    parser.add_argument("--until", metavar="HH:MM", help="UTC time after which no case is handed out")
    parser.add_argument("--save", type=Path, default=Path(tempfile.gettempdir()) / "stepscope-fuzz-failures",
                        help="where failing inputs are written")
    args = parser.parse_args()

    from tests.fuzz_oracle import PAGES, memory_bound

    for signum in (signal.SIGINT, signal.SIGTERM):  # also when started in the background (SIGINT ignored)
        signal.signal(signum, signal.default_int_handler)
    if args.target == "snapshots":
        return snapshot_campaign(args.cases, args.seed, args.save)
    t0 = time.monotonic()
    todo = CaseStream(args.cases, args.seed)
    deadline = _deadline(args.until)
    work = Path(tempfile.mkdtemp(prefix="stepscope-fuzz-"))
    ctx = multiprocessing.get_context("spawn")
    workers = [Worker(ctx, work, i) for i in range(args.workers)]
    spawned = len(workers)
    results: dict[int, tuple[Any, ...]] = {}
    failures: list[tuple[int, str]] = []
    next_case = ingested_seen = 0
    cli_cases = 0
    try:
        while len(results) < len(todo):
            stop = deadline is not None and dt.datetime.now(dt.timezone.utc) >= deadline
            for w in workers:
                if w.ready and w.task is None and next_case < len(todo) and not stop:
                    cli = args.cli_every > 0 and next_case % args.cli_every == 0
                    cli_cases += cli
                    dash = args.dashboard_every > 0 and ingested_seen % args.dashboard_every == args.dashboard_every - 1
                    w.budget = args.timeout * (1 + len(PAGES) * dash + 2 * cli)
                    w.send(next_case, (next_case, todo[next_case], dash, cli))
                    next_case += 1
            if stop and all(w.task is None for w in workers):
                break
            for conn in wait([w.conn for w in workers], timeout=1.0):
                w = next(x for x in workers if x.conn is conn)
                try:
                    kind, payload = conn.recv()
                except (EOFError, OSError):
                    _lost(w, "crash: the worker process died", todo, results, failures, args.save)
                    workers[workers.index(w)] = Worker(ctx, work, spawned)
                    spawned += 1
                    continue
                if kind == "ready":
                    w.ready = True
                    continue
                index = payload[0]
                results[index] = payload
                w.task = None
                if payload[1] == "ingested":
                    ingested_seen += 1
                for failure in payload[4]:
                    failures.append((index, failure))
                if payload[4]:
                    _save(todo[index], index, payload[4], args.save)
                    print(f"FAIL case {index}: {payload[4]}\n  {todo[index].describe()[:800]}", flush=True)
                if len(results) % 25 == 0:
                    _progress(results, failures, t0)
            now = time.monotonic()
            for i, w in enumerate(workers):
                if w.task is not None and now - w.started > w.budget:
                    _lost(w, f"hang: no answer within {w.budget:.0f} s", todo, results, failures, args.save)
                    workers[i] = Worker(ctx, work, spawned)
                    spawned += 1
    except KeyboardInterrupt:  # Ctrl-C: report what ran; the cases in flight are left out
        print(f"interrupted: {sum(w.task is not None for w in workers)} cases in flight left out", flush=True)
    finally:
        for w in workers:
            w.kill()
        shutil.rmtree(work, ignore_errors=True)
    _report(results, failures, len(todo), t0, args, cli_cases, memory_bound())
    return 1 if failures else 0


def snapshot_campaign(n: int, seed_value: int, save: Path) -> int:
    """N mutated memory snapshots through ``load_snapshot`` and ``snapshot_table``."""
    from tests.fuzz_snapshots import check_snapshot, materialize_snapshot, snapshot_cases

    t0 = time.monotonic()
    bound = _bound_address_space()
    kinds: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    failures: list[tuple[int, str]] = []
    work = Path(tempfile.mkdtemp(prefix="stepscope-fuzz-snap-"))
    done = 0
    for chunk in range(0, n, CHUNK):
        drawn: list[Any] = []

        @seed(seed_value * 100_000 + chunk // CHUNK)
        @settings(max_examples=min(CHUNK, n - chunk), database=None, phases=[Phase.generate], deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(snapshot_cases())
        def collect(case: Any) -> None:
            drawn.append(case)

        collect()
        for case in drawn[:min(CHUNK, n - chunk)]:
            path = work / "snapshot.pickle"
            path.write_bytes(materialize_snapshot(case))
            kind, problems, reason = check_snapshot(path)
            kinds[kind] += 1
            if reason is not None:
                reasons[reason] += 1
            failures += [(done, p) for p in problems]
            if problems:
                save.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, save / f"snapshot-{done:05d}.pickle")
                print(f"FAIL snapshot case {done}: {problems}\n  {case.describe()[:800]}", flush=True)
            done += 1
        print(f"[{dt.datetime.now(dt.timezone.utc):%H:%M:%S}] {done} snapshot cases: {dict(kinds)}, "
              f"{len(failures)} failures", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    print(f"snapshot cases tried: {done} (seed {seed_value}), {time.monotonic() - t0:.0f} s: read {kinds['read']}, "
          f"refused {kinds['refused']}, crashed {kinds['crashed']}; failures: {len(failures)}; "
          f"address space bounded at {bound / 2**30:.1f} GiB (a MemoryError counts as a crash)")
    print("refusals by reason:")
    for reason, count in reasons.most_common():
        print(f"  {count:6d}  {reason}")
    for index, failure in failures[:50]:
        print(f"  case {index}: {failure[:300]}")
    return 1 if failures else 0


SNAPSHOT_HEADROOM = 3 << 30
"""Address space a snapshot case may add to the campaign's own (the snapshots are cut to
``MAX_ROWS`` rows): the cases run in this process, so the bound is an rlimit, and a case past it
raises MemoryError, a failure, instead of the kernel's OOM killer ending the campaign unreported
(it did: a first 10,000-case run died at 21 GB with nothing printed)."""


def _bound_address_space() -> int:
    """Limit this process's address space to what it uses now plus :data:`SNAPSHOT_HEADROOM`."""
    import resource

    with open("/proc/self/status") as status:
        used = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    bound = used + SNAPSHOT_HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (bound, resource.getrlimit(resource.RLIMIT_AS)[1]))
    return bound


def _deadline(until: str | None) -> dt.datetime | None:
    if not until:
        return None
    hour, minute = map(int, until.split(":"))
    now = dt.datetime.now(dt.timezone.utc)
    chosen = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    return chosen if chosen > now else chosen + dt.timedelta(days=1)


def _lost(w: Worker, why: str, todo: CaseStream, results: dict[int, tuple[Any, ...]],
          failures: list[tuple[int, str]], save: Path) -> None:
    """A case whose worker hung or died: a failure of its own; the worker is replaced."""
    index = w.task
    w.kill()
    if index is None:
        return
    results[index] = (index, "hang" if why.startswith("hang") else "crashed", None, None, [why], None, False, False,
                      time.monotonic() - w.started)
    failures.append((index, why))
    _save(todo[index], index, [why], save)
    print(f"FAIL case {index}: {why}\n  {todo[index].describe()[:800]}", flush=True)


def _save(case: Case, index: int, problems: list[str], save: Path) -> None:
    save.mkdir(parents=True, exist_ok=True)
    name, data = materialize(case)
    (save / f"{index:05d}-{name}").write_bytes(data)
    (save / f"{index:05d}.txt").write_text(case.describe() + "\n" + "\n".join(problems) + "\n")


def _progress(results: dict[int, tuple[Any, ...]], failures: list[tuple[int, str]], t0: float) -> None:
    kinds = collections.Counter(r[1] for r in results.values())
    elapsed = time.monotonic() - t0
    print(f"[{dt.datetime.now(dt.timezone.utc):%H:%M:%S}] {len(results)} cases in {elapsed:.0f} s "
          f"({len(results) / elapsed:.2f}/s): {dict(kinds)}, {len(failures)} failures", flush=True)


def _report(results: dict[int, tuple[Any, ...]], failures: list[tuple[int, str]], drawn: int, t0: float,
            args: argparse.Namespace, cli_cases: int, bound: int) -> None:
    kinds = collections.Counter(r[1] for r in results.values())
    reasons = collections.Counter(r[2] for r in results.values() if r[1] == "refused")
    dashboards = sum(1 for r in results.values() if r[6])
    clis = sum(1 for r in results.values() if r[7])
    peaks = [r[5] for r in results.values() if r[5]]
    slowest = max((r[8] for r in results.values()), default=0)
    classes = collections.Counter(_failure_class(f) for _, f in failures)
    print()
    print(f"cases tried: {len(results)} of {drawn} drawn (seed {args.seed}), {time.monotonic() - t0:.0f} s, "
          f"{args.workers} workers")
    print(f"outcomes: ingested {kinds['ingested']}, refused {kinds['refused']}, crashed {kinds['crashed']}, "
          f"hang {kinds['hang']}")
    print(f"dashboard: every page (AppTest) on {dashboards} ingested cases (every {args.dashboard_every}th); "
          f"command line on {clis} cases (every {args.cli_every}th, {cli_cases} handed out)")
    print(f"bounds: hang {args.timeout:.0f} s per case, plus as much per dashboard page and command "
          f"(slowest case {slowest:.1f} s); memory {bound / 2**20:.0f} MiB "
          f"over a case's start (highest peak RSS {max(peaks, default=0) / 2**20:.0f} MiB)")
    print("refusals by reason:")
    for reason, count in reasons.most_common():
        print(f"  {count:6d}  {reason}")
    print(f"failures: {len(failures)} in {len({i for i, _ in failures})} cases")
    for cls, count in classes.most_common():
        print(f"  {count:6d}  {cls}")
    for index, failure in failures[:50]:
        print(f"  case {index}: {failure[:300]}")


def _failure_class(failure: str) -> str:
    for key in ("internal error", "hang", "crash", "memory", "store changed", "store unreadable", "summary raised",
                "strict JSON", "dashboard", "cli", "sum to", "share", "outside"):
        if key in failure:
            return key
    return "other"


if __name__ == "__main__":
    sys.exit(main())
