"""Resolve what the user names on the command line into (store, run): a run id, a baseline name,
a store folder, or trace files/folders ingested on the fly into a temporary store."""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from stepscope.errors import TraceFormatError, UsageError


class NotFound(UsageError):
    """The spec names no baseline, run, store or trace folder: for a baseline, "none yet"."""


@dataclass(frozen=True)
class RunRef:
    """A run in a store."""

    store: Path
    run: str


def resolve(spec: str, store: Path | None, stack: contextlib.ExitStack) -> RunRef:
    """``spec`` is tried as: a baseline name in ``store``, a run of ``store``, a store folder
    (holding one run, or ``STORE::RUN``), then trace files or folders, ingested into a
    temporary store that lives as long as ``stack``."""
    from stepscope.store.baselines import baseline_run
    from stepscope.store.runs import stored_runs
    from stepscope.store.writer import run_id

    if store is not None:
        named = baseline_run(store, spec)
        if named is not None:
            return RunRef(store, named)
        if run_id(spec) in stored_runs(store):
            return RunRef(store, run_id(spec))
    folder, sep, run = spec.partition("::")
    path = Path(folder)
    if (path / "sources").is_dir():
        runs = stored_runs(path)
        if sep:
            if run_id(run) not in runs:
                raise NotFound(f"{spec}: no run {run!r} in store {path} (runs: {', '.join(runs) or 'none'})")
            return RunRef(path, run_id(run))
        if len(runs) != 1:
            raise UsageError(f"{spec}: store holds {len(runs)} runs ({', '.join(runs)}); name one as {path}::RUN")
        return RunRef(path, runs[0])
    if path.exists():
        return _ingest(path, stack)
    if store is not None:
        from stepscope.store.baselines import load_baselines

        known = ", ".join(sorted(load_baselines(store)))
        raise NotFound(f"{spec}: not a baseline name or run in store {store} (baselines: {known or 'none'}), "
                       "nor a store or trace folder")
    raise NotFound(f"{spec}: not a baseline name or run (no --store given), nor a store or trace folder")


def _ingest(path: Path, stack: contextlib.ExitStack) -> RunRef:
    from stepscope.store.files import select_trace_files
    from stepscope.store.ingest import default_run_name, ingest_paths

    files = select_trace_files([path]).files
    if not files:
        raise UsageError(f"{path}: no trace files (*.json, *.json.gz) here")
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="stepscope-compare-")))
    report = ingest_paths([path], tmp, default_run_name(files))
    if report.errors:
        raise TraceFormatError(path, "unreadable trace: " + "; ".join(report.errors))
    return RunRef(tmp, report.run)


@contextlib.contextmanager
def resolved(specs: list[str], store: Path | None) -> Iterator[list[RunRef]]:
    """Resolve several specs; temporary stores are removed on exit."""
    with contextlib.ExitStack() as stack:
        yield [resolve(spec, store, stack) for spec in specs]
