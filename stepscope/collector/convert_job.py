"""Child process that compresses and ingests one exported trace, off the training process.

Converting a trace is Python-heavy (decode, columns, Parquet); in a thread of the training
process it competes for the GIL and measurably slowed the steps that ran meanwhile (a 20 ms step
took 140 ms during a 0.3 s ingest). In a child process, at the lowest CPU priority, it uses
another core, or leftover time when there is none. The child imports the store, never torch. Protocol: a JSON job on stdin, a JSON result on stdout, and on
failure exit status 1 with one ``<file>: <problem>`` line on stderr.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def convert(job: dict[str, Any]) -> dict[str, Any]:
    """Gzip ``job['plain']`` into ``job['target']`` and ingest it; returns the source id."""
    from stepscope.collector.export import gzip_file
    from stepscope.store.ingest import ingest_trace_file

    target = gzip_file(Path(job["plain"]), Path(job["target"]))
    done = ingest_trace_file(target, job["store"], job["run_name"], rank=job["rank"],
                             rank_from=job["rank_from"], metadata=job["metadata"],
                             tags=job["tags"])
    return {"source": done.source, "events": done.events}


def main() -> int:
    if hasattr(os, "nice"):
        # Yield to training when cores are short: a niceness-19 process gets ~1.5% of a core
        # that a niceness-0 training process also wants.
        os.nice(19)
    try:
        result = convert(json.load(sys.stdin))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which applies its policy
        message = str(exc) if str(exc) else type(exc).__name__
        sys.stderr.write(f"{type(exc).__name__}: {message}\n")
        return 1
    sys.stdout.write(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
