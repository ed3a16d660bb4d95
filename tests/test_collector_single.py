"""The collector in one process: both API forms, the pieces they are built of, and import cost."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tests.collector_support import PATIENT_FLUSH_S  # noqa: E402  (also puts examples/ on the path)
import toy_transformer  # noqa: E402

import stepscope  # noqa: E402
from stepscope.collector.distributed import agree_run_name, default_run_name, rank_info  # noqa: E402
from stepscope.collector.memory_snapshot import load_snapshot, snapshot_table  # noqa: E402
from stepscope.collector.options import Recording, Schedule, profiler_kwargs  # noqa: E402
from stepscope.collector.step_timer import StepTimer  # noqa: E402
from stepscope.errors import TraceFormatError, UsageError  # noqa: E402
from stepscope.store import open_store  # noqa: E402
from tests.conftest import REPO, load_raw  # noqa: E402

TINY = toy_transformer.ToyConfig(vocab=64, d_model=32, heads=2, layers=1, ff=64, seq=16, batch=2)


def test_import_stepscope_does_not_import_torch() -> None:
    code = ("import sys, stepscope, stepscope.collector, stepscope.collector.convert_job; "
            "assert 'torch' not in sys.modules; "
            "from stepscope.collector.session import profile; "
            "assert stepscope.profile is profile and 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_trace_handler_on_a_profiler_the_user_owns(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model, optimizer = toy_transformer.build(TINY)
    data = torch.Generator().manual_seed(0)
    handler = stepscope.trace_handler(store=tmp_path / "store", run="owned", model=model,
                                      optimizer=optimizer, trace_dir=tmp_path / "traces",
                                      strict=True, flush_timeout_s=PATIENT_FLUSH_S)
    with torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2),
                                record_shapes=True, profile_memory=True, on_trace_ready=handler) as prof:
        for _ in range(9):
            toy_transformer.train_step(model, optimizer, toy_transformer.synthetic_batch(TINY, data))
            prof.step()
    handler.close()
    store = open_store(tmp_path / "store")
    steps = store.sql("SELECT list(step ORDER BY step) AS s FROM steps").to_pylist()
    assert steps == [{"s": [2, 3, 6, 7]}]  # two cycles of wait 1, warmup 1, active 2
    # Two cycles of one process are one session: one run, not a run per cycle.
    assert store.sql("SELECT DISTINCT run FROM sources").to_pylist() == [{"run": "owned"}]
    files = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert files == ["rank0.cycle1.pt.trace.json.gz", "rank0.pt.trace.json.gz"]
    raw_steps = sorted(e["name"] for f in files for e in load_raw(tmp_path / "traces" / f)["traceEvents"]
                       if e.get("name", "").startswith("ProfilerStep#"))
    assert raw_steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#6", "ProfilerStep#7"]
    roles = store.sql("SELECT role, count(*) AS n, count(step) AS with_step FROM memory_roles "
                      "GROUP BY role ORDER BY role").to_pylist()
    n = len(list(model.parameters()))
    # A bare handler sees the end of each window only: one capture per trace, step unknown.
    assert roles == [{"role": "gradient", "n": 2 * n, "with_step": 0},
                     {"role": "optimizer_state", "n": 2 * 3 * n, "with_step": 0},
                     {"role": "parameter", "n": 2 * n, "with_step": 0}]


def test_profile_single_process(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model, optimizer = toy_transformer.build(TINY)
    data = torch.Generator().manual_seed(0)
    with stepscope.profile(store=tmp_path, run="single", wait=2, warmup=1, active=1,
                           model=model, optimizer=optimizer, strict=True,
                           flush_timeout_s=PATIENT_FLUSH_S) as prof:
        for _ in range(6):
            toy_transformer.train_step(model, optimizer, toy_transformer.synthetic_batch(TINY, data))
            prof.step(samples=TINY.batch)
    assert (prof.run, prof.rank) == ("single", 0)
    store = open_store(tmp_path)
    assert store.sql("SELECT ranks FROM runs").to_pylist() == [{"ranks": 1}]
    timed = store.sql("SELECT step, profiled, samples, tokens, disturbed_by FROM step_times "
                      "ORDER BY step").to_pylist()
    assert [(r["step"], r["profiled"]) for r in timed] == [(s, s == 3) for s in range(6)]
    # What the collector did in each step, from the schedule: warm-up (2) and recording (3)
    # under the profiler, step 4 pays for its stop and the export; the trace is then converted
    # in the background (a second or more, so step 5 of this tiny model runs meanwhile).
    marks = [r["disturbed_by"] for r in timed]
    assert marks[:5] == [None, None, "profiler", "profiler", "profiler"]
    assert marks[5] in ("writer", "conversion")
    assert {(r["samples"], r["tokens"]) for r in timed} == {(TINY.batch, None)}
    meta = json.loads(store.sql("SELECT metadata FROM sources").to_pylist()[0]["metadata"])
    assert (meta["rank"], meta["world_size"], meta["backend"]) == (0, 1, None)
    # No exported file is left behind in the store when no trace_dir was asked for (the store's
    # own records under .content/, such as the run's job.json, are not exports).
    assert not [p for p in tmp_path.rglob("*.json*") if ".content" not in p.relative_to(tmp_path).parts]


def test_schedule_is_bounded() -> None:
    with pytest.raises(UsageError, match="repeat"):
        stepscope.profile(store="unused", repeat=0)
    with pytest.raises(UsageError, match="convert"):
        stepscope.profile(store="unused", convert="later")
    with pytest.raises(UsageError, match="active"):
        Schedule(active=0)
    assert Schedule(wait=5, warmup=2, active=3, repeat=2, skip_first=1).last_step == 20


@pytest.mark.parametrize("with_stack", [False, True])
def test_stacks_are_opt_in(tmp_path: Path, with_stack: bool) -> None:
    kwargs = profiler_kwargs(Schedule(), Recording(with_stack=with_stack))
    assert kwargs["record_shapes"] and kwargs["profile_memory"]
    assert ("experimental_config" in kwargs) is with_stack
    torch.set_num_threads(1)
    model, optimizer = toy_transformer.build(TINY)
    data = torch.Generator().manual_seed(0)
    with stepscope.profile(store=tmp_path / "store", run="stacks", wait=0, warmup=1, active=1,
                           with_stack=with_stack, trace_dir=tmp_path, convert="thread",
                           strict=True, flush_timeout_s=PATIENT_FLUSH_S) as prof:
        for _ in range(2):
            toy_transformer.train_step(model, optimizer, toy_transformer.synthetic_batch(TINY, data))
            prof.step()
    events = load_raw(tmp_path / "rank0.pt.trace.json.gz")["traceEvents"]
    python_frames = sum(1 for e in events if e.get("cat") == "python_function")
    assert (python_frames > 0) is with_stack


def test_run_name_without_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert agree_run_name("mine") == "mine"
    info = rank_info()
    assert (info.rank, info.world_size) == (0, 1)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job42")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert default_run_name().endswith("-job42")
    assert agree_run_name(None) == default_run_name()
    info = rank_info()
    assert (info.rank, info.world_size) == (3, 8)


def test_step_timer_without_cuda() -> None:
    timer = StepTimer(use_cuda=False)
    timer.begin()
    timer.end_step(0, profiled=False, tokens=10)
    timer.end_step(1, profiled=True)
    rows = timer.snapshot().table("s").to_pylist()
    assert [(r["step"], r["profiled"], r["tokens"], r["samples"], r["gpu_ns"]) for r in rows] == [
        (0, False, 10, None, None), (1, True, None, None, None)]
    assert all(r["wall_ns"] >= 0 for r in rows)
    assert rows[1]["start_ns"] >= rows[0]["start_ns"] + rows[0]["wall_ns"]


def test_step_timer_counts_each_steps_preemptions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step stores the involuntary switches between its boundaries (not the running total),
    and null where the platform cannot count them per thread."""
    from stepscope.collector import step_timer

    counts = iter([5, 5, 7, 10])
    monkeypatch.setattr(step_timer, "_thread_switches", lambda: lambda: next(counts))
    timer = StepTimer(use_cuda=False)
    timer.begin()
    for step in range(3):
        timer.end_step(step, profiled=False)
    assert [r["preemptions"] for r in timer.snapshot().table("s").to_pylist()] == [0, 2, 3]

    monkeypatch.setattr(step_timer, "_thread_switches", lambda: None)
    timer = StepTimer(use_cuda=False)
    timer.begin()
    timer.end_step(0, profiled=False)
    assert [r["preemptions"] for r in timer.snapshot().table("s").to_pylist()] == [None]


def test_step_timer_reads_this_threads_switches_on_linux() -> None:
    """On Linux the reader is the calling thread's own count: it never decreases."""
    from stepscope.collector.step_timer import _thread_switches

    if sys.platform != "linux":
        pytest.skip("per-thread resource usage is Linux-only")
    read = _thread_switches()
    assert read is not None and 0 <= read() <= read()


class _Trap:
    """Unpickling this with plain ``pickle`` calls ``_sprung``: what a hostile file would do."""

    sprung = False

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_sprung, ())


def _sprung() -> None:
    _Trap.sprung = True


def test_snapshot_unpickler_refuses_every_global(tmp_path: Path) -> None:
    hostile = tmp_path / "hostile.pickle"
    hostile.write_bytes(pickle.dumps({"segments": [_Trap()]}))
    with pytest.raises(TraceFormatError, match="hostile.pickle: .*refused global"):
        load_snapshot(hostile)
    assert not _Trap.sprung
    torch_global = tmp_path / "tensor.pickle"
    buffer = io.BytesIO()
    pickle.dump({"segments": [], "x": torch.zeros(1)}, buffer)
    torch_global.write_bytes(buffer.getvalue())
    with pytest.raises(TraceFormatError, match="refused global torch"):
        load_snapshot(torch_global)


def test_real_snapshot_to_table(shared_traces: Path) -> None:
    """The MAGMA27 snapshot: counts from the dict, plus the allocator's own invariant that a
    segment's blocks tile it exactly."""
    snapshot = load_snapshot(shared_traces / "memsnap" / "magma27_cs336" / "memory_snapshot.pickle")
    table = snapshot_table(snapshot, "abc").to_pylist()
    segments = [r for r in table if r["record"] == "segment"]
    blocks = [r for r in table if r["record"] == "block"]
    traces = [r for r in table if r["record"] == "trace"]
    assert len(segments) == len(snapshot["segments"]) == 216
    assert len(blocks) == sum(len(s["blocks"]) for s in snapshot["segments"]) == 455
    assert len(traces) == sum(len(t) for t in snapshot["device_traces"]) == 5163
    for segment in segments:
        inside = [b["bytes"] for b in blocks if b["segment_addr"] == segment["addr"]]
        assert sum(inside) == segment["bytes"]
    actions = {a: sum(1 for t in traces if t["action"] == a) for a in {t["action"] for t in traces}}
    assert actions == {"alloc": 1721, "free_requested": 1721, "free_completed": 1721}
    assert all(t["ts_ns"] % 1000 == 0 and t["ts_ns"] > 1.7e18 for t in traces)
    assert json.loads(traces[0]["frames"])[0][2] == "forward"



def test_writer_never_blocks_training_and_bounds_the_exit_wait(caplog: pytest.LogCaptureFixture) -> None:
    """A stuck write: later submissions are dropped (not waited for) once the queue is full, and
    closing gives up after its bounded wait instead of hanging the job's exit."""
    import threading

    from stepscope.collector.faults import FaultPolicy
    from stepscope.collector.worker import BackgroundWriter

    release = threading.Event()
    started = threading.Event()
    policy = FaultPolicy()
    writer = BackgroundWriter(policy, max_pending=1)

    def stuck() -> None:
        started.set()
        release.wait()

    assert writer.submit("stuck write", stuck)
    assert started.wait(timeout=30)
    assert writer.submit("queued write", lambda: None)  # fills the one free slot
    assert not writer.submit("one write too many", lambda: None)
    assert policy.dropped == 1
    assert writer.close(timeout_s=0.05) is False
    assert any("abandoned" in r.getMessage() for r in caplog.records)
    release.set()


class _FakeEvent:
    """Stands in for ``torch.cuda.Event`` on this CPU build: completes when told to."""

    clock = 0.0

    def __init__(self) -> None:
        _FakeEvent.clock += 1.5  # each event 1.5 ms after the previous one
        self.at = _FakeEvent.clock
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def elapsed_time(self, end: _FakeEvent) -> float:
        assert self.done and end.done, "elapsed_time on an event that has not completed"
        return end.at - self.at


def test_step_timer_resolves_gpu_time_without_synchronising(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path's bookkeeping: a step's GPU time is filled once its end event completes,
    never by waiting during training; only the final snapshot waits."""
    events: list[_FakeEvent] = []

    def record(_self: StepTimer) -> _FakeEvent:
        events.append(_FakeEvent())
        return events[-1]

    monkeypatch.setattr(StepTimer, "_record_event", record)
    timer = StepTimer(use_cuda=True)
    timer.begin()
    timer.end_step(0, profiled=False)
    timer.end_step(1, profiled=False)
    assert [r["gpu_ns"] for r in timer.snapshot().table("s").to_pylist()] == [None, None]
    events[0].done = events[1].done = True
    timer.end_step(2, profiled=False)  # step 0 resolves now; steps 1-2 still wait for events 2-3
    assert [r["gpu_ns"] for r in timer.snapshot().table("s").to_pylist()] == [1_500_000, None, None]
    final = timer.snapshot(wait_for_gpu=True).table("s").to_pylist()
    assert [r["gpu_ns"] for r in final] == [1_500_000] * 3


class _RecorderWithSnapshot:
    """A ``SnapshotRecorder`` stand-in that hands out a real snapshot (this build has no CUDA)."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.snapshot = snapshot
        self.recording = False
        self.starts = 0

    def start(self) -> None:
        self.recording = True
        self.starts += 1

    def take(self) -> dict[str, Any]:
        self.recording = False
        return self.snapshot

    def stop(self) -> None:
        self.recording = False


def test_snapshot_is_stored_with_its_trace(tmp_path: Path, shared_traces: Path) -> None:
    """The path a CUDA run takes: history turned on before the window, the snapshot taken at the
    trace and written as ``memory_snapshot`` rows of that trace's source."""
    snapshot = load_snapshot(shared_traces / "memsnap" / "magma27_cs336" / "memory_snapshot.pickle")
    torch.set_num_threads(1)
    model, optimizer = toy_transformer.build(TINY)
    data = torch.Generator().manual_seed(0)
    prof = stepscope.profile(store=tmp_path, run="snap", wait=2, warmup=1, active=1,
                             convert="thread", strict=True, flush_timeout_s=PATIENT_FLUSH_S)
    recorder = _RecorderWithSnapshot(snapshot)
    prof.handler.snapshots = recorder  # type: ignore[assignment]
    with prof:
        for step in range(5):
            assert recorder.recording is (step in (2, 3))  # on from the warmup step to the trace
            toy_transformer.train_step(model, optimizer, toy_transformer.synthetic_batch(TINY, data))
            prof.step()
    assert recorder.starts == 1
    rows = open_store(tmp_path).sql(
        "SELECT record, count(*) AS n FROM memory_snapshot m SEMI JOIN sources s USING (source) "
        "GROUP BY record ORDER BY record").to_pylist()
    assert rows == [{"record": "block", "n": 455}, {"record": "segment", "n": 216},
                    {"record": "trace", "n": 5163}]


def test_step_times_are_rewritten_while_the_job_runs(tmp_path: Path) -> None:
    """After the trace, step times are rewritten periodically, so a job that dies keeps them."""
    torch.set_num_threads(1)
    model, optimizer = toy_transformer.build(TINY)
    data = torch.Generator().manual_seed(0)
    seen_during: list[list[int]] = []
    with stepscope.profile(store=tmp_path, run="periodic", wait=0, warmup=1, active=1,
                           convert="thread", strict=True, flush_timeout_s=PATIENT_FLUSH_S,
                           step_times_every_s=0) as prof:
        for step in range(6):
            toy_transformer.train_step(model, optimizer, toy_transformer.synthetic_batch(TINY, data))
            prof.step()
            if step == 4:
                assert prof.handler.flush(timeout_s=60)
                seen_during = [r["steps"] for r in open_store(tmp_path).sql(
                    "SELECT list(step ORDER BY step) AS steps FROM step_times").to_pylist()]
    assert seen_during == [[0, 1, 2, 3, 4]]
    final = open_store(tmp_path).sql("SELECT list(step ORDER BY step) AS steps FROM step_times")
    assert final.to_pylist() == [{"steps": [0, 1, 2, 3, 4, 5]}]
