"""Convert a batch's files on a Ray cluster: one task per trace file (``--engine ray``).

Each task runs the same conversion as a local worker process (``ingest._convert_job``): it reads
its file, converts it and writes its parts and per-rank tables straight into the store (a local
folder the workers share, or an object store: ``ingest`` uploads them), and returns the converted
trace, a skip, or the one ``<file>: <problem>`` line that refuses it, exactly as locally. The
driver (the ``stepscope ingest`` process) only commits: one commit per run on an object store,
in the batch's order on a folder. A task that dies (its worker killed, out of memory) costs its
file, with Ray's reason in the line.

The trace files must be readable by the workers at the path given (a shared filesystem, or a
one-machine cluster). ``ray_address`` (``--ray-address``) joins a running cluster
(``ray.init(address=...)``: ``auto``, ``ray://head:10001``); without it, and when Ray is not
already initialised in this process, a local cluster is started for the batch and stopped after.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from stepscope.errors import UsageError
from stepscope.store.commit import problem_line

TASK_CPUS = 1
"""CPUs a conversion task asks for: one DuckDB thread per conversion (``ingest.INGEST_THREADS``)."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise UsageError("--engine ray needs Ray: pip install 'stepscope[ray]'") from exc
    return ray


def convert_batch(batch: Sequence[Any], convert_job: Callable[[Any], Any], *, address: str | None = None,
                  on_converted: Callable[[Path], None] | None = None) -> Iterator[tuple[Any, Any]]:
    """Run ``convert_job(job)`` for every job of ``batch`` as a Ray task; call ``on_converted``
    as each task completes (the progress bar), and yield ``(job, outcome)`` in the batch's order
    once all have."""
    ray = _ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, logging_level="warning", log_to_driver=False)
    try:
        task = ray.remote(num_cpus=TASK_CPUS, max_retries=0)(convert_job)
        refs = [task.remote(job) for job in batch]
        job_of = {ref: job for ref, job in zip(refs, batch)}
        outcomes: dict[Any, Any] = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                try:
                    outcomes[ref] = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a task that died costs its file
                    outcomes[ref] = problem_line(job_of[ref].file, exc)
                if on_converted:
                    on_converted(job_of[ref].file)
    finally:
        if started:
            ray.shutdown()
    for ref in refs:
        yield job_of[ref], outcomes[ref]
