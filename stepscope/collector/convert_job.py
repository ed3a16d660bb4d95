"""Child process that compresses and ingests one exported trace, off the training process.

Converting a trace is Python-heavy (decode, columns, Parquet); in a thread of the training
process it competes for the GIL and measurably slowed the steps that ran meanwhile (a 20 ms step
took 140 ms during a 0.3 s ingest). In a child process, at the lowest CPU priority, it uses
another core, or leftover time when there is none. The child imports the store, never torch.

Protocol: a JSON job on stdin, a JSON result on stdout; on failure exit status 1 and a JSON
failure on stdout (the exception's type, message, errno and trace problem), which
``raise_failure`` turns back into an exception of the same kind in the parent, so that the fault
policy classes it as it would the same failure in a thread ("disk full", a refused trace...).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def convert(job: dict[str, Any]) -> dict[str, Any]:
    """Gzip ``job['plain']`` into ``job['target']`` and ingest it; returns the source id and the
    run it was stored in (another than asked for when it is another session of the rank)."""
    from stepscope.collector.export import gzip_file
    from stepscope.store.ingest import ingest_trace_file

    target = gzip_file(Path(job["plain"]), Path(job["target"]))
    done = ingest_trace_file(target, job["store"], job["run_name"], rank=job["rank"],
                             rank_from=job["rank_from"], metadata=job["metadata"],
                             tags=job["tags"])
    return {"source": done.source, "events": done.events, "run": done.run}


def main() -> int:
    if hasattr(os, "nice"):
        # Yield to training when cores are short: a niceness-19 process gets ~1.5% of a core
        # that a niceness-0 training process also wants.
        os.nice(19)
    try:
        result = convert(json.load(sys.stdin))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which applies its policy
        sys.stdout.write(json.dumps(failure(exc)))
        return 1
    sys.stdout.write(json.dumps(result))
    return 0


def failure(exc: BaseException) -> dict[str, Any]:
    """What the parent needs to rebuild ``exc``: its type, message, errno, trace problem."""
    return {"error": type(exc).__name__, "message": str(exc) or type(exc).__name__,
            "errno": getattr(exc, "errno", None), "strerror": getattr(exc, "strerror", None),
            "problem": getattr(exc, "problem", None)}


def raise_failure(stdout: str, stderr: str, returncode: int, trace_name: str) -> None:
    """Raise the child's failure in the parent: an ``OSError`` with its errno, a
    ``TraceFormatError`` naming ``trace_name``, else a ``RuntimeError`` with the child's words."""
    from stepscope.errors import TraceFormatError

    try:
        doc = json.loads(stdout)
    except ValueError:
        lines = stderr.strip().splitlines()
        raise RuntimeError(f"converting {trace_name} failed: "
                           f"{lines[-1] if lines else f'exit status {returncode}'}") from None
    if isinstance(doc.get("errno"), int):
        raise OSError(doc["errno"], doc.get("strerror") or doc["message"])
    if doc["error"] == "TraceFormatError" and doc.get("problem"):
        raise TraceFormatError(trace_name, doc["problem"])
    raise RuntimeError(f"converting {trace_name} failed: {doc['error']}: {doc['message']}")


if __name__ == "__main__":
    sys.exit(main())
