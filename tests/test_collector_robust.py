"""The collector under hostile conditions: odd characters in what it records, stores that cannot
be written, disks that fill up silently, jobs killed by SIGTERM. Each case lost traces, repeated
warnings or left files in the store before."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stepscope.cli import main  # noqa: E402
from stepscope.store import open_store  # noqa: E402
from tests.conftest import REPO, load_raw  # noqa: E402
from tests.test_collector_faults import STEPS, train, warnings  # noqa: E402

ODD_ARGV = [
    "train.py", "--cfg", '{"lr": 1}', 'model.name="gpt-2"', "+trainer.devices=[0,1]",
    "data.path=C:\\data\\set", "--sep", "\t", "multi\nline", "héllo ✓ 日本", "it's", "100%41",
    "\x01", "\udcff",  # the last: an argv byte that is not UTF-8, as Python holds it
]
ODD_TAGS = {"note": 'say "hi" \\ bye', 'k"ey': "v\nw"}


def _stored_metadata(store: Path) -> dict[str, Any]:
    [row] = open_store(store).sql("SELECT metadata, tags FROM sources").to_pylist()
    return {"metadata": json.loads(row["metadata"]), "tags": json.loads(row["tags"])}


def test_metadata_with_quotes_backslashes_and_unicode_reaches_the_store_intact(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = tmp_path / 'we"ird \\ dir é'
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", list(ODD_ARGV))
    store, kept = tmp_path / "store", tmp_path / "kept"
    done, _ = train(store, convert="process", strict=True, tags=ODD_TAGS, trace_dir=kept)
    assert done == STEPS
    stored = _stored_metadata(store)
    meta = stored["metadata"]
    # What the collector hands to the store, and what the trace itself carries through Kineto.
    for recorded in (meta, meta["stepscope"]):
        assert [os.fsencode(a) for a in recorded["command_line"]] == [os.fsencode(a) for a in ODD_ARGV]
        assert os.fsencode(recorded["cwd"]) == os.fsencode(str(cwd))
    assert meta["stepscope"]["tags"] == ODD_TAGS == stored["tags"]
    # The kept Kineto file is valid JSON, and ingested on its own it gives the same metadata.
    [trace] = list(kept.iterdir())
    assert "stepscope" in load_raw(trace)
    assert main(["ingest", str(trace), "--store", str(tmp_path / "offline"), "--quiet"]) == 0
    offline = _stored_metadata_untagged(tmp_path / "offline")
    assert [os.fsencode(a) for a in offline["stepscope"]["command_line"]] == [os.fsencode(a) for a in ODD_ARGV]
    assert offline["stepscope"]["tags"] == ODD_TAGS


def _stored_metadata_untagged(store: Path) -> dict[str, Any]:
    [row] = open_store(store).sql("SELECT metadata FROM sources").to_pylist()
    return json.loads(row["metadata"])


def test_a_read_only_store_is_one_warning_without_temporary_names(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each refused write names a different temporary file; the warning must come once."""
    import tempfile

    def refused(suffix: str | None = None, prefix: str | None = None, dir: Any = None) -> str:  # noqa: A002
        name = f"{prefix or ''}{os.urandom(4).hex()}{suffix or ''}"
        raise PermissionError(errno.EROFS, os.strerror(errno.EROFS), str(Path(dir) / name))

    def refused_part(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), f"/x/part-a.parquet.{os.getpid()}.{os.urandom(4).hex()}.tmp")

    monkeypatch.setattr(tempfile, "mkdtemp", refused)
    monkeypatch.setattr("stepscope.collector.sink.write_partition", refused_part)
    done, prof = train(tmp_path / "store", repeat=2)
    assert done == STEPS and prof.policy.dropped >= 2
    [message] = warnings(caplog)
    assert "store not writable" in message and str(tmp_path / "store") in message
    assert ".stepscope-export" not in message and ".tmp" not in message


class _SilentKineto:
    """A Kineto result whose export writes nothing, as Kineto does on a full disk."""

    def save(self, path: str) -> None:
        pass


@pytest.mark.parametrize(("free_bytes", "said"), [(0, "disk full"), (10 << 30, "incomplete")])
def test_a_silently_failed_export_is_named_for_what_it_is(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
        free_bytes: int, said: str) -> None:
    real_usage = shutil.disk_usage
    monkeypatch.setattr("stepscope.collector.handler.finished_cycle", lambda _prof: _SilentKineto())
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real_usage(path)._replace(free=free_bytes))
    done, prof = train(tmp_path / "store")
    assert done == STEPS and prof.policy.dropped == 1
    [message] = warnings(caplog)
    assert said in message and "FileNotFoundError" not in message and "export.json" not in message


def test_disk_full_in_the_conversion_child_is_disk_full(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default converter is a child process: its errno must survive the process boundary."""
    sitecustomize = tmp_path / "inject" / "sitecustomize.py"
    sitecustomize.parent.mkdir()
    sitecustomize.write_text(textwrap.dedent("""
        import errno, os
        import stepscope.store.writer as writer
        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/somewhere/part.parquet.1.2.tmp")
        writer.write_partition = full
        import stepscope.store.ingest as ingest
        ingest.write_partition = full
    """))
    monkeypatch.setenv("PYTHONPATH", f"{sitecustomize.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    done, prof = train(tmp_path / "store", convert="process", repeat=2)
    assert done == STEPS and prof.policy.dropped >= 2
    [message] = warnings(caplog)
    assert "disk full" in message and ".tmp" not in message and ".stepscope-export" not in message


KILLED_JOB = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    import torch, toy_transformer, stepscope
    import stepscope.collector.handler as handler

    def slow_export(results, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"traceEvents": []}')
        Path(sys.argv[2]).touch()
        time.sleep(120)  # the job is killed here, mid-export
        return path

    handler.save_plain = slow_export
    torch.set_num_threads(1)
    cfg = toy_transformer.ToyConfig(vocab=64, d_model=32, heads=2, layers=1, ff=64, seq=16, batch=2)
    model, opt = toy_transformer.build(cfg)
    data = torch.Generator().manual_seed(0)
    with stepscope.profile(store=sys.argv[1], run="killed", wait=1, warmup=1, active=1) as prof:
        for _ in range(4):
            toy_transformer.train_step(model, opt, toy_transformer.synthetic_batch(cfg, data))
            prof.step()
""")


def test_sigterm_mid_export_leaves_no_export_folder(tmp_path: Path) -> None:
    store, ready = tmp_path / "store", tmp_path / "exporting"
    job = subprocess.Popen([sys.executable, "-c", KILLED_JOB, str(store), str(ready), str(REPO / "examples")],
                           cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert job.poll() is None, job.stderr.read()
            assert time.monotonic() < deadline, "the job never started its export"
            time.sleep(0.05)
        assert list(store.glob(".stepscope-export-*")), "the export folder should exist mid-export"
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=60) == -signal.SIGTERM  # it still dies of the signal
    finally:
        job.kill()
        job.wait()
        job.stderr.close()
    assert not list(store.glob(".stepscope-export-*"))


def test_the_next_start_removes_export_folders_of_dead_processes(tmp_path: Path) -> None:
    import stepscope
    from stepscope.collector import exports

    store = tmp_path / "store"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    host = exports._HOST
    folders = {
        "dead": store / f"{exports.PREFIX}{host}-{int(dead.stdout)}-abc123",
        "alive": store / f"{exports.PREFIX}{host}-{os.getpid()}-def456",
        "old": store / f"{exports.PREFIX}otherhost-12-ghi789",
        "recent elsewhere": store / f"{exports.PREFIX}otherhost-13-jkl012",
    }
    for folder in folders.values():
        folder.mkdir(parents=True)
        (folder / "rank0.pt.trace.json.gz.export.json").write_text("{}")
    old = time.time() - exports.STALE_S - 60
    os.utime(folders["old"], (old, old))
    handler = stepscope.trace_handler(store=store, run="next")
    try:
        handler.open()
    finally:
        handler.close()
    assert {name for name, folder in folders.items() if folder.exists()} == {"alive", "recent elsewhere"}


def test_the_child_failure_protocol_keeps_errno_and_problem() -> None:
    from stepscope.collector import convert_job
    from stepscope.errors import StoreWriteError, TraceFormatError

    written = StoreWriteError("/tmp/x/.stepscope-export-h-1-a/rank0.pt.trace.json.gz", "/s",
                              OSError(errno.ENOSPC, "No space left on device", "/s/part.parquet.1.a.tmp"))
    with pytest.raises(OSError) as info:
        convert_job.raise_failure(json.dumps(convert_job.failure(written)), "", 1, "rank0.pt.trace.json.gz")
    assert (info.value.errno, info.value.strerror) == (errno.ENOSPC, "No space left on device")
    refused = TraceFormatError("/tmp/x/.stepscope-export-h-1-a/rank0.pt.trace.json.gz", "not valid JSON")
    with pytest.raises(TraceFormatError) as refused_info:
        convert_job.raise_failure(json.dumps(convert_job.failure(refused)), "", 1, "rank0.pt.trace.json.gz")
    assert str(refused_info.value) == "rank0.pt.trace.json.gz: not valid JSON"
    with pytest.raises(RuntimeError, match="exit status -9"):
        convert_job.raise_failure("", "", -9, "rank0.pt.trace.json.gz")


def test_warnings_are_logged_once_per_cause_class(caplog: pytest.LogCaptureFixture) -> None:
    from stepscope.collector.faults import FaultPolicy

    policy = FaultPolicy(store="/s")
    with caplog.at_level(logging.DEBUG, logger="stepscope.collector"):
        for name in ("a.tmp", "b.tmp"):
            policy.failed("writing", OSError(errno.ENOSPC, "No space left on device", name))
            policy.failed("writing", OSError(errno.EROFS, "Read-only file system", name))
    assert [m for m in warnings(caplog)] == [
        "stepscope: writing failed (disk full in /s (OSError: No space left on device)); dropped it, "
        "training continues (further failures with this cause are logged at debug level)",
        "stepscope: writing failed (store not writable in /s (OSError: Read-only file system)); dropped it, "
        "training continues (further failures with this cause are logged at debug level)",
    ]
