"""The store on object storage: ingest, commit semantics, the commands and other readers, against
moto's S3 server on 127.0.0.1 (started here), and ingest on a local Ray cluster.

The independent side of every check is the same trace ingested into a local folder: the answers
(the summary's JSON, the rows of the views) must be equal, and the object store must hold exactly
the layout docs/STORE.md describes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

from stepscope.analysis.summary import build_summary  # noqa: E402
from stepscope.store import open_store  # noqa: E402
from stepscope.store.ingest import IngestReport, ingest_paths  # noqa: E402
from tests.conftest import copy_run, sample_store  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "gloo-3ranks-late"
TWO_RANKS = REPO / "sample_traces" / "ddp-gloo-2ranks"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A moto S3 server on 127.0.0.1, the AWS_* environment pointing at it, and its s3fs."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                                            "AWS_ENDPOINT_URL", "XDG_CACHE_HOME")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=f"http://{host}:{port}",
                      XDG_CACHE_HOME=str(tmp_path_factory.mktemp("xdg-cache")))
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}, use_listings_cache=False)
    fs.mkdir("stepscope-test")
    try:
        yield fs
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _keys(fs: Any, url: str) -> set[str]:
    base = url.removeprefix("s3://")
    return {p[len(base) + 1:] for p in fs.find(base)}


def _local_files(root: Path) -> set[str]:
    """The store's parts (a local folder's ``.compact/`` files aside: runs are compacted only
    in a folder, docs/STORE.md "Compacted runs")."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*.parquet")
            if not p.relative_to(root).as_posix().startswith(".compact/")}


def _summary(store: Path | str, run: str) -> dict[str, Any]:
    with open_store(store) as opened:
        return build_summary(opened, run)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample in a local folder (run ``late``), once for the tests that compare the object
    store with it: the independent side; they only read it. Copied from the session's store of
    the sample (ingested once per test run), which gives what ingesting it here would, file for
    file (:func:`tests.conftest.copy_run`, tests/test_suite_setup.py)."""
    root = tmp_path_factory.mktemp("local") / "store"
    copy_run(sample_store(tmp_path_factory, SAMPLE.name), root, SAMPLE.name, as_run="late")
    return root


@pytest.fixture(scope="module")
def ingested_to_s3(s3: Any) -> tuple[str, IngestReport]:
    """The sample ingested into the object store (run ``late``) and the ingest's report, once for
    the tests that read it (the answers, other engines); none of them writes to it."""
    url = "s3://stepscope-test/ingest"
    return url, ingest_paths([SAMPLE], url, "late")


def test_ingest_into_s3_answers_as_locally(s3: Any, local: Path, ingested_to_s3: tuple[str, IngestReport]) -> None:
    url, report = ingested_to_s3
    assert report.ok, report.errors
    assert [t.rank for t in report.stored] == [0, 1, 2]
    # the same parts at the same keys (the layout is the store's, unchanged)
    assert {k for k in _keys(s3, url) if k.endswith(".parquet")} == _local_files(local)
    # nothing left of the commit: no lock, no temporary object
    assert not any(k.startswith(".commit.lock") or k.endswith(".tmp") for k in _keys(s3, url))
    assert _summary(url, "late") == _summary(local, "late")
    # the same again is skipped, file by file, as locally
    again = ingest_paths([SAMPLE], url, "late")
    assert again.ok and all(t.skipped for t in again.stored)


def test_commands_read_an_s3_store(s3: Any, local: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.cli import main
    from stepscope.render import html_report

    # the charts' JavaScript takes vl-convert ~5 s to build and is tested with the report itself
    monkeypatch.setattr(html_report, "javascript_bundle", lambda: "/* charts */")

    url = "s3://stepscope-test/commands"
    assert main(["ingest", str(SAMPLE), "--store", url, "--run", "late", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["runs", "--store", url]) == 0
    assert "late" in capsys.readouterr().out
    assert main(["sql", "SELECT rank, count(*) AS n FROM events GROUP BY rank ORDER BY rank", "--store", url,
                 "--format", "json"]) == 0
    counted = json.loads(capsys.readouterr().out)
    with open_store(local) as opened:
        assert counted == opened.sql("SELECT rank, count(*) AS n FROM events GROUP BY rank ORDER BY rank").to_pylist()
    assert main(["summary", "--store", url, "--run", "late", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == _summary(local, "late")
    assert main(["baseline", "set", "main", "late", "--store", url]) == 0
    capsys.readouterr()
    assert main(["compare", "main", "late", "--store", url, "--format", "json"]) == 0
    compared = json.loads(capsys.readouterr().out)
    assert compared["baseline"]["run"] == compared["candidate"]["run"] == "late"
    assert compared["verdict"]["status"] == "pass"
    out = tmp_path / "report.html"
    assert main(["report", "late", "--store", url, "--out", str(out)]) == 0
    assert "stepscope report: late" in out.read_text()
    # the dashboard on the URL: the Overview renders the run, with no error
    from streamlit.testing.v1 import AppTest

    monkeypatch.setattr(sys, "argv", ["app.py", "--store", url])
    at = AppTest.from_file(str(REPO / "stepscope" / "dashboard" / "app.py"), default_timeout=120)
    at.query_params["run"] = "late"
    at.switch_page("views/overview.py")
    at.run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    assert [t.value for t in at.title] == ["Overview: late"]
    assert at.metric, "the Overview showed no figures"


def test_uncommitted_parts_are_invisible(s3: Any, tmp_path: Path) -> None:
    """A crash after the parts and before the sources row: the object store holds the parts,
    every reader sees nothing of the trace (the commit rule), and a later ingest commits it."""
    from stepscope.store.ingest import convert_file

    url = "s3://stepscope-test/crash"
    trace = SAMPLE / "rank1.pt.trace.json.gz"
    assert ingest_paths([SAMPLE / "rank0.pt.trace.json.gz"], url, "late").ok
    converted = convert_file(trace, url, "late")  # parts uploaded, never committed: the "crash"
    assert any(k.startswith("events/run=late/rank=1/") for k in _keys(s3, url))
    with open_store(url) as opened:
        assert opened.sql("SELECT DISTINCT rank FROM events").column("rank").to_pylist() == [0]
        assert opened.sql("SELECT count(*) AS n FROM sources").column("n")[0].as_py() == 1
    report = ingest_paths([trace], url, "late")
    assert report.ok and not report.stored[0].skipped and report.stored[0].source == converted.source
    with open_store(url) as opened:
        assert sorted(opened.sql("SELECT DISTINCT rank FROM events").column("rank").to_pylist()) == [0, 1]


def test_a_held_lock_is_waited_for_and_an_expired_one_taken_over(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.errors import StoreError
    from stepscope.store import objectstore

    store = objectstore.RemoteStore("s3://stepscope-test/lock")
    first = objectstore.CommitLock(store)
    first.acquire()
    monkeypatch.setattr(objectstore, "LOCK_WAIT_S", 0.3)
    with pytest.raises(StoreError, match="commit lock is held by"):
        objectstore.CommitLock(store).acquire()
    first.renew()  # the holder renews (If-Match on its own ETag)
    monkeypatch.setattr(objectstore, "LEASE_S", -1.0)  # leases written from now on are expired
    first.renew()
    second = objectstore.CommitLock(store)
    second.acquire()  # took over the expired lease
    with pytest.raises(StoreError, match="lock was lost"):
        first.renew()
    second.release()
    assert not s3.exists("stepscope-test/lock/.commit.lock")


def test_polars_and_duckdb_read_the_layout_over_s3(s3: Any, ingested_to_s3: tuple[str, IngestReport]) -> None:
    """Other engines read the store unchanged: Polars' own S3 client, and DuckDB through fsspec,
    with the hive partitioning docs/SCALE.md gives."""
    polars = pytest.importorskip("polars")
    import duckdb

    url, report = ingested_to_s3
    assert report.ok, report.errors
    with open_store(url) as opened:
        expected = sorted(tuple(r.values()) for r in opened.sql(
            "SELECT rank, count(*) AS n FROM events GROUP BY rank").to_pylist())
    options = {"aws_endpoint_url": os.environ["AWS_ENDPOINT_URL"], "aws_access_key_id": "testing",
               "aws_secret_access_key": "testing", "aws_region": "us-east-1", "aws_allow_http": "true"}
    frame = polars.scan_parquet(f"{url}/events/**/*.parquet", hive_partitioning=True, storage_options=options)
    counted = frame.group_by("rank").len().collect()
    assert sorted(zip(counted["rank"].to_list(), counted["len"].to_list())) == expected
    con = duckdb.connect()
    con.register_filesystem(s3)
    rows = con.sql(f"SELECT rank, count(*) FROM read_parquet('{url}/events/**/*.parquet', hive_partitioning = true, "
                   "hive_types = {'run': VARCHAR, 'rank': INTEGER}) GROUP BY rank").fetchall()
    assert sorted(rows) == expected


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="error", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def test_ray_ingest_into_s3_answers_as_locally(s3: Any, ray_cluster: Any, tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    shutil.copytree(SAMPLE, folder)
    (folder / "rank3.pt.trace.json").write_text('{"traceEvents": [')
    url = "s3://stepscope-test/ray"
    converted: list[Path] = []
    remote = ingest_paths([folder], url, "late", engine="ray", on_converted=converted.append)
    local = ingest_paths([folder], tmp_path / "local", "late")
    assert sorted(converted) == sorted(folder.iterdir())  # the progress saw every task end
    assert remote.errors == local.errors and len(remote.errors) == 1
    assert [(t.rank, t.source, t.events) for t in remote.stored] == [(t.rank, t.source, t.events)
                                                                     for t in local.stored]
    assert _summary(url, "late") == _summary(tmp_path / "local", "late")


def test_profile_writes_into_s3(s3: Any) -> None:
    """``stepscope.profile(store="s3://...")``: the trace and the collector's tables (step times)
    land in the object store, committed, with nothing exported left behind."""
    torch = pytest.importorskip("torch")
    import tests.collector_support  # noqa: F401  (puts examples/ on the path)
    import toy_transformer

    import stepscope

    torch.set_num_threads(1)
    tiny = toy_transformer.ToyConfig(vocab=64, d_model=32, heads=2, layers=1, ff=64, seq=16, batch=2)
    model, optimizer = toy_transformer.build(tiny)
    data = torch.Generator().manual_seed(0)
    url = "s3://stepscope-test/profile"
    with stepscope.profile(store=url, run="live", wait=1, warmup=1, active=1, model=model, optimizer=optimizer,
                           convert="thread", strict=True) as prof:
        for _ in range(4):
            toy_transformer.train_step(model, optimizer, toy_transformer.synthetic_batch(tiny, data))
            prof.step()
    with open_store(url) as opened:
        assert opened.sql("SELECT ranks FROM runs").to_pylist() == [{"ranks": 1}]
        timed = opened.sql("SELECT step, profiled FROM step_times ORDER BY step").to_pylist()
        assert [(r["step"], r["profiled"]) for r in timed] == [(s, s == 2) for s in range(4)]
        assert opened.sql("SELECT count(*) AS n FROM events").column("n")[0].as_py() > 0
    # no exported trace left behind (the run's job record under .content/ is the store's own)
    assert not [k for k in _keys(s3, url) if ".json" in k and not k.startswith(".content/")]


def test_two_recordings_of_a_rank_become_two_runs_in_s3_as_locally(s3: Any, tmp_path: Path) -> None:
    """Sessions on an object store: the later recording's parts are moved to ``<run>-session2``
    in the object store (one batch, decided in order), and a refused overlap leaves no part."""
    from tests.conftest import write_trace
    from tests.test_ingest_sessions import MINUTES_US, _events

    folder = tmp_path / "traces"
    write_trace(folder / "a" / "rank0.json", _events(), distributedInfo={"rank": 0})
    write_trace(folder / "b" / "rank0.json", _events(shift_us=8 * MINUTES_US), distributedInfo={"rank": 0})
    url = "s3://stepscope-test/sessions"
    remote = ingest_paths([folder], url, "job")
    local = ingest_paths([folder], tmp_path / "local", "job")
    assert remote.ok and [(t.run, t.note) for t in remote.stored] == [(t.run, t.note) for t in local.stored]
    assert [t.run for t in remote.stored] == ["job", "job-session2"]
    moved = remote.stored[1].source
    keys = _keys(s3, url)
    assert not [k for k in keys if k.startswith("events/run=job/") and moved in k]  # moved, not copied
    assert f"events/run=job-session2/rank=0/part-{moved}.parquet" in keys
    with open_store(url) as opened:
        spans = opened.sql("SELECT run, max(ts_ns + dur_ns) - min(ts_ns) AS span FROM events "
                           "WHERE kind = 'kernel' GROUP BY run").to_pylist()
    assert {r["run"]: r["span"] for r in spans} == {"job": 220_000, "job-session2": 220_000}
    # a different trace overlapping rank 0 of job: refused with the local line, its parts removed
    write_trace(folder / "c" / "rank0.json", _events(shift_us=50, pid=2), distributedInfo={"rank": 0})
    refused = ingest_paths([folder / "c"], url, "job")
    assert refused.errors == ingest_paths([folder / "c"], tmp_path / "local", "job").errors
    assert len(refused.errors) == 1 and "overlaps it in time" in refused.errors[0]
    assert _keys(s3, url) - keys == set()


def test_a_run_holds_one_job_in_s3_as_locally(s3: Any, tmp_path: Path) -> None:
    """The run's job record is committed with the run's rows: a fact added by a later batch
    (the device) is uploaded, so a third batch of another device is placed as locally."""
    from tests.test_ingest_sessions import A100, V100, _rank

    url = "s3://stepscope-test/jobs"
    batches = [[_rank(tmp_path / "a", "rank0.json", 0)], [_rank(tmp_path / "b", "rank1.json", 1, devices=A100)],
               [_rank(tmp_path / "c", "rank2.json", 2, devices=V100)]]
    remote = [ingest_paths(files, url, "job") for files in batches]
    local = [ingest_paths(files, tmp_path / "local", "job") for files in batches]
    assert [[(t.run, t.note) for t in r.stored] for r in remote] == [[(t.run, t.note) for t in r.stored] for r in local]
    assert [r.stored[0].run for r in remote] == ["job", "job", "job-session2"]
    assert "device Tesla V100-SXM2-16GB, the run's NVIDIA A100-SXM4-80GB" in remote[2].stored[0].note
    assert {".content/run=job/job.json", ".content/run=job-session2/job.json"} <= _keys(s3, url)
