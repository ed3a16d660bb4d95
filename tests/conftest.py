"""Shared fixtures: the real traces in ../shared (skipped when absent) and a tiny trace builder."""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import shutil
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from filelock import FileLock

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """``../shared/traces``; tests that need it skip cleanly when it is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip("../shared/traces is not present")
    return SHARED_TRACES


def load_raw(path: Path, exact: bool = False) -> dict[str, Any]:
    """A trace's JSON straight from disk: the independent side of every count check.

    ``exact`` parses fractional numbers as ``Decimal`` so expected nanoseconds carry no float error.
    """
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data, parse_float=Decimal) if exact else json.loads(data)


def write_trace(path: Path, events: list[dict[str, Any]], **top: Any) -> Path:
    """Write a small Kineto-style trace (gzipped when the name ends in .gz)."""
    doc = json.dumps({"schemaVersion": 1, **top, "traceEvents": events}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(doc) if path.name.endswith(".gz") else doc)
    return path


@pytest.fixture
def make_trace(tmp_path: Path) -> Callable[..., Path]:
    """Build a trace file in a temp folder: ``make_trace("rank0.json", events, distributedInfo=...)``."""

    def build(name: str, events: list[dict[str, Any]], **top: Any) -> Path:
        return write_trace(tmp_path / "traces" / name, events, **top)

    return build


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder that every pytest-xdist worker of this test run shares.

    Each worker has a base temp folder of its own (``pytest-N/popen-gwK``); their parent is
    the run's, so what is built there once serves every worker. Without xdist it is the base
    temp folder itself (its parent holds earlier runs, which must not be reused)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """``build(folder)`` run once per test run for ``name``, whichever worker asks first.

    The others wait on a file lock and get the same folder. A build that failed leaves no
    ``.done`` marker, so the next caller removes what it left and builds again (and fails the
    same way, in its own test). Only for folders the tests read: a test that changes a store
    copies it first (``shutil.copytree``), as before.
    """
    root = run_root(tmp_path_factory) / "built-once"
    root.mkdir(exist_ok=True)
    folder = root / name
    done = root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            if folder.exists():
                shutil.rmtree(folder)
            build(folder)
            done.touch()
    return folder


def ingested_store(tmp_path_factory: pytest.TempPathFactory, relative: str) -> Path:
    """The store of one shared trace, or of a folder of a job's ranks (run ``t``), ingested once
    per test run, shared by the xdist workers (:func:`built_once`), keyed by the path relative to
    ../shared/traces."""
    from stepscope.store.ingest import ingest_paths

    def build(store: Path) -> None:
        report = ingest_paths([SHARED_TRACES / relative], store, "t")
        assert report.ok, report.errors

    return built_once(tmp_path_factory, "ingested-" + hashlib.sha256(relative.encode()).hexdigest()[:16], build)


@pytest.fixture(scope="session")
def ingested(tmp_path_factory: pytest.TempPathFactory, shared_traces: Path) -> Callable[[str], Path]:
    """:func:`ingested_store` by path (skipped without ../shared/traces)."""
    return functools.partial(ingested_store, tmp_path_factory)


def sample_store(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """The store of one bundled sample run (``sample_traces/<name>/``, run ``<name>``), ingested
    once per test run and shared by the xdist workers (:func:`built_once`)."""
    from stepscope.store.ingest import ingest_paths

    def build(store: Path) -> None:
        report = ingest_paths(sorted((REPO / "sample_traces" / name).glob("*.json.gz")), store, name)
        assert report.ok, report.errors

    return built_once(tmp_path_factory, f"sample-{name}", build)


@pytest.fixture(scope="session")
def sample_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """:func:`sample_store` by name."""
    return functools.partial(sample_store, tmp_path_factory)


def copy_store(store: Path, to: Path) -> Path:
    """A copy of a shared store (``ingested``, ``sample_run``) for a test that changes it, without
    the analysis caches that other tests left in it."""
    shutil.copytree(store, to, ignore=lambda folder, names: ["cache"] if Path(folder) == store else [])
    return to


def copy_run(source: Path, store: Path, run: str, as_run: str | None = None) -> None:
    """Put run ``run`` of the store ``source`` into ``store`` as ingesting its traces there would,
    under the name ``as_run`` when given (a test's own name for a shared sample run).

    A store keeps each run in folders of its own (``<table>/run=<run>/``, ``.content/run=<run>/``:
    docs/STORE.md), so copying them is the ingest's result without paying for it again; the
    parts name the run only in the folder's name and in ``sources.run_name``, which a renamed
    copy rewrites. The run's compacted tables are made again, as its ingest makes them, rather
    than copied: their manifest names the parts' inodes, which a copy changes. Derived caches
    stay behind."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stepscope.store.compact import COMPACT_DIR, compact_run

    name = as_run or run
    for table in source.iterdir():
        if (table.is_dir() and table.name not in ("cache", COMPACT_DIR)
                and (table / f"run={run}").is_dir()):
            shutil.copytree(table / f"run={run}", store / table.name / f"run={name}")
    if name != run:
        for part in (store / "sources" / f"run={name}").rglob("*.parquet"):
            sources = pq.read_table(part)
            at = sources.schema.get_field_index("run_name")
            renamed = pa.array([name] * sources.num_rows, sources.schema.field(at).type)
            pq.write_table(sources.set_column(at, sources.schema.field(at), renamed), part)
    (store / ".commit.lock").touch()
    compact_run(store, name)


DDP_RECORDING = {"run": "ddp test/2 ranks", "steps": 9, "wait": 3, "warmup": 2, "active": 2,
                 "bucket_cap_mb": 0.5}
"""The one real 2-rank gloo DDP recording (examples/train_ddp_cpu.py) that the collector's and
the communication analysis' tests read: its run name (stored as ``ddp-test-2-ranks``), steps,
schedule and DDP bucket cap."""


@pytest.fixture(scope="session")
def ddp_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with ``store/`` and ``traces/`` of :data:`DDP_RECORDING`, recorded once per test
    run (~10 s on 2 cores) and shared by the xdist workers (:func:`built_once`). Read only."""
    pytest.importorskip("torch")
    from tests.collector_support import EXAMPLES  # noqa: F401  (puts examples/ on sys.path)

    def record(folder: Path) -> None:
        import train_ddp_cpu

        cfg = train_ddp_cpu.DDPRun(store=str(folder / "store"), trace_dir=str(folder / "traces"),
                                   strict=True, **DDP_RECORDING)
        train_ddp_cpu.train(cfg, world_size=2)

    return built_once(tmp_path_factory, "ddp-recording", record)


@pytest.fixture(scope="session")
def hta_python() -> Path:
    """An interpreter with HolisticTraceAnalysis 0.5.0, for cross-checks through tests/hta_runner.py.

    ``$STEPSCOPE_HTA_PYTHON``, else ``../hta-venv``, else ``.hta-venv`` (``.ci/install_hta.sh``);
    tests that need it skip when none is found.
    """
    from tests.hta_runner import find_hta_python

    python = find_hta_python()
    if python is None:
        pytest.skip("no HTA interpreter: set STEPSCOPE_HTA_PYTHON or run .ci/install_hta.sh")
    return python


SPREAD = frozenset({
    "test_analysis_copies.py",
    "test_breakdown.py",
    "test_dashboard_apptest.py",
    "test_dashboard_every_trace.py",
    "test_flops.py",
    "test_hta_crosscheck.py",
    "test_ingest_real.py",
    "test_one_truth.py",
    "test_rankstats_flops.py",
    "test_summary.py",
    "test_traces_as_they_are.py",
})
"""Files whose tests pytest-xdist may hand to any worker one by one. Each is a sweep over the
shared traces whose only costly state is session-wide (:func:`built_once`, ``ingested``), so
splitting it costs nothing, while kept whole it would leave one worker on it alone at the end."""


LONG_FIRST = (
    "test_ci_workflow.py",
    "test_pytest_plugin.py",
    "test_dashboard_browser.py",
    "test_collector_watch.py",
    "test_store_s3.py",
    "test_collector_ddp.py",
)
"""Files of few tests that each run long (training processes, pytest sessions, a browser, an S3
server), handed out before everything else. pytest-xdist hands out the files with the most tests
first, so these would come last, and one worker would end the run on one of them alone (the CI
workflow's one test is ~15 training processes in a row)."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` (what ``./setup.sh test`` runs) keeps each file's tests on one worker,
    except the files of :data:`SPREAD`, whose tests go to any worker one by one.

    A file's module-scoped fixtures (a store it ingests once for its tests) are then built once,
    and tests that share a file's state never race. (pytest-xdist's own ``loadgroup`` cannot do
    this under pytest 9, where a test's id can no longer be renamed.) Work goes out largest
    file first, single tests last, so the workers finish together; :data:`LONG_FIRST` before all."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FilesAndSpreadTests(LoadScopeScheduling):
        long_first = False

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if path.rsplit("/", 1)[-1] in SPREAD else path

        def _assign_work_unit(self, node: Any) -> None:
            if not self.long_first:  # the queue is complete when the first unit goes out
                for name in reversed(LONG_FIRST):
                    for scope in [s for s in self.workqueue if s.rsplit("/", 1)[-1] == name]:
                        self.workqueue.move_to_end(scope, last=False)
                self.long_first = True
            super()._assign_work_unit(node)

    return FilesAndSpreadTests(config, log)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite the golden files under tests/golden/ instead of comparing with them")


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """``golden(name, text)``: compare ``text`` with ``tests/golden/<name>``; rewrite it only when
    pytest runs with ``--update-golden``."""
    update = request.config.getoption("--update-golden")

    def check(name: str, text: str) -> None:
        path = REPO / "tests" / "golden" / name
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            return
        assert path.exists(), f"{path} missing: run pytest --update-golden once and review it"
        assert text == path.read_text(encoding="utf-8"), f"{name} differs from its golden file"

    return check


@pytest.fixture(scope="session", autouse=True)
def _streamlit_components_scanned_once() -> Iterator[None]:
    """Streamlit's installed-component scan, done once per test process instead of once per AppTest.

    Every ``AppTest`` first discovers Streamlit components by parsing the metadata of every
    installed distribution (114 in the test environment: ~1 s of CPU, more than drawing any page
    of a small trace), and about a hundred tests start an AppTest. What is installed cannot
    change during a test run, so the first scan's answer is every scan's.
    Patched only where a test module already imported Streamlit (collection imports the AppTest
    modules); a Streamlit without this scanner runs its own scan each time, as before."""
    if "streamlit" not in sys.modules:
        yield
        return
    try:
        from streamlit.components.v2 import manifest_scanner
    except ImportError:
        yield
        return
    scan = manifest_scanner.scan_component_manifests
    found = functools.cache(lambda: list(scan()))
    manifest_scanner.scan_component_manifests = lambda max_workers=None: list(found())
    yield
    manifest_scanner.scan_component_manifests = scan


@pytest.fixture(scope="session", autouse=True)
def _streamlit_scripts_compiled_once() -> Iterator[None]:
    """Each page script compiled once per test process instead of once per AppTest run.

    Streamlit compiles a script (after rewriting its syntax tree for "magic") into a cache that
    belongs to one AppTest, and the entry script into a new cache on every ``run()``: the
    dashboard's app and nine pages cost ~0.16 s of CPU per AppTest, paid ~150 times a test run
    (test_dashboard_every_trace alone opens every page of 52 traces). The cache here is keyed
    by what the compilation reads (the file's path, size and modification time, and whether
    magic is on), so a script that a test writes or changes is compiled again, as before.
    Patched only where a test module already imported Streamlit, as the scan above."""
    if "streamlit" not in sys.modules:
        yield
        return
    from streamlit import config
    from streamlit.runtime.scriptrunner.script_cache import ScriptCache

    compile_script = ScriptCache.get_bytecode

    @functools.lru_cache(maxsize=256)
    def compiled(path: str, size: int, mtime_ns: int, magic: bool) -> Any:
        return compile_script(ScriptCache(), path)

    def get_bytecode(self: ScriptCache, script_path: str) -> Any:
        path = os.path.abspath(script_path)
        stat = os.stat(path)
        return compiled(path, stat.st_size, stat.st_mtime_ns, bool(config.get_option("runner.magicEnabled")))

    ScriptCache.get_bytecode = get_bytecode  # type: ignore[method-assign]
    yield
    ScriptCache.get_bytecode = compile_script  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _keep_main_module() -> Iterator[None]:
    """Put ``sys.modules["__main__"]`` back after every test.

    Streamlit's AppTest installs a fake ``__main__`` for the page it runs and leaves it there;
    ``mp.spawn`` and ``multiprocessing`` children started by a later test then fail to import
    their entry point, so the suite would pass or fail depending on test order.
    """
    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main
