"""Never hurt the job: each fault is injected into a real profiled loop, which must complete.

Without ``strict`` the loop finishes every step and stepscope logs exactly one warning naming the
cause; with ``strict=True`` the same fault raises ``CollectorError``.
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import tests.collector_support  # noqa: E402,F401  (puts examples/ on the path)
import toy_transformer  # noqa: E402

import stepscope  # noqa: E402
from stepscope.collector import CollectorError  # noqa: E402
from stepscope.store import open_store  # noqa: E402

STEPS = 6
TINY = toy_transformer.ToyConfig(vocab=64, d_model=32, heads=2, layers=1, ff=64, seq=16, batch=2)


def train(store: Path, completed: list[int] | None = None, **options: Any) -> tuple[int, Any]:
    """A tiny profiled loop (steps 2-3 recorded); returns the steps completed and the profile.

    ``completed`` receives each finished step, so a test still sees them when the end raises.
    """
    torch.set_num_threads(1)
    model, optimizer = toy_transformer.build(TINY)
    data = torch.Generator().manual_seed(0)
    completed = [] if completed is None else completed
    done = 0
    options = {"run": "faulty", "wait": 1, "warmup": 1, "active": 2, "model": model,
               "optimizer": optimizer, "convert": "thread", **options}
    with stepscope.profile(store=store, **options) as prof:
        for _ in range(STEPS):
            toy_transformer.train_step(model, optimizer, toy_transformer.synthetic_batch(TINY, data))
            done += 1
            completed.append(done)
            prof.step()
    return done, prof


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "stepscope.collector" and r.levelno >= logging.WARNING]


def unwritable(tmp_path: Path) -> Path:
    """A store path below a regular file: no user, not even root, can create it."""
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    return blocker / "store"


def test_unwritable_store(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    done, prof = train(unwritable(tmp_path), repeat=2)
    assert done == STEPS
    assert prof.policy.dropped >= 2  # both traces of the repeating schedule
    [message] = warnings(caplog)  # one warning although two traces failed
    assert "NotADirectoryError" in message or "FileExistsError" in message
    assert "blocker" in message


def test_unwritable_store_strict(tmp_path: Path) -> None:
    completed: list[int] = []
    with pytest.raises(CollectorError, match="blocker"):
        train(unwritable(tmp_path), completed, strict=True)
    assert len(completed) == STEPS  # raised when the with-block ended, after every step ran


def no_space(*_args: Any, **_kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("stepscope.store.ingest.write_partition", no_space)
    monkeypatch.setattr("stepscope.collector.sink.write_partition", no_space)
    done, prof = train(tmp_path / "store")
    assert done == STEPS and prof.policy.dropped == 1
    [message] = warnings(caplog)
    assert "No space left on device" in message
    assert open_store(tmp_path / "store").sql("SELECT count(*) AS n FROM runs").to_pylist() == [{"n": 0}]


def test_disk_full_strict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("stepscope.store.ingest.write_partition", no_space)
    with pytest.raises(CollectorError, match="No space left on device"):
        train(tmp_path / "store", strict=True)


def test_conversion_raising(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> None:
        raise ValueError("converter bug")

    monkeypatch.setattr("stepscope.store.ingest.convert", broken)
    done, prof = train(tmp_path / "store")
    assert done == STEPS and prof.policy.dropped == 1
    [message] = warnings(caplog)
    assert "ValueError: converter bug" in message


def test_conversion_failing_in_the_child_process(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The default converter runs in a child process; its failure comes back as one warning."""

    def not_a_trace(_results: Any, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"no": "traceEvents"}')
        return path

    monkeypatch.setattr("stepscope.collector.handler.save_plain", not_a_trace)
    done, prof = train(tmp_path / "store", convert="process")
    assert done == STEPS and prof.policy.dropped == 1
    [message] = warnings(caplog)
    assert "TraceFormatError" in message and "rank0.pt.trace.json.gz" in message
    with pytest.raises(CollectorError, match="TraceFormatError"):
        train(tmp_path / "store2", convert="process", strict=True)


def test_profiler_failing_mid_run(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.profiler itself raising: profiling stops for good, steps are still timed."""

    def step(_self: Any) -> None:
        raise RuntimeError("kineto exploded")

    monkeypatch.setattr(torch.profiler.profile, "step", step)
    done, prof = train(tmp_path / "store")
    assert done == STEPS and len(prof.timer) == STEPS
    [message] = warnings(caplog)
    assert "RuntimeError: kineto exploded" in message
    with pytest.raises(CollectorError, match="kineto exploded"):
        train(tmp_path / "store2", strict=True)
