"""Run HolisticTraceAnalysis (HTA) on real traces, in its own interpreter, for cross-checks.

Why a separate interpreter: HTA (PyPI ``holistictraceanalysis==0.5.0``) pulls jupyterlab and
pins its own pandas, so it must not enter stepscope's environment. It lives in a venv of its own
(``.ci/install_hta.sh`` makes ``<repo>/.hta-venv``) and this module talks to it through a
subprocess. The same file is both sides:

- imported by tests/benchmarks (stdlib only): ``find_hta_python()`` and ``run_hta(...)``;
- run as a script by HTA's interpreter: ``<hta python> tests/hta_runner.py --out F DIR`` loads
  the traces and writes HTA's numbers to F as JSON.

What HTA needs from its input, read from HTA 0.5.0's source (``hta/common/trace_file.py``):
with ``trace_dir`` it loads every ``*.gz``/``*.json`` file in that folder (so the folder must
hold only Kineto traces, one per rank) and takes each file's rank from the first
``"rank": <n>`` it finds in the text (the regex needs whitespace after the colon, as in
Kineto's pretty-printed JSON); a file without one becomes rank 0, and two such files collide
(the later wins). File names do not matter. Passing ``trace_files={rank: path}`` instead
avoids all of that, so ``run_hta`` accepts either.

What comes back (HTA's own units and rounding, as its DataFrames hold them):
``temporal_breakdown`` (``get_temporal_breakdown``: ``idle_time(us)``, ``compute_time(us)``,
``non_compute_time(us)``, ``kernel_time(us)`` and ``*_pctg`` per rank),
``comm_comp_overlap`` (``get_comm_comp_overlap``: ``comp_comm_overlap_pctg`` per rank, rounded
to 2 decimals by HTA), ``idle_time_breakdown`` (``get_idle_time_breakdown`` for every rank,
not HTA's default of rank 0 only: ``rank, stream, idle_category, idle_time`` in us,
``idle_time_ratio``), each as a list of row dicts, plus ``ranks``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

HTA_PYTHON_ENV = "STEPSCOPE_HTA_PYTHON"


def find_hta_python() -> Path | None:
    """The interpreter that has HTA, or None.

    Looked for in this order: ``$STEPSCOPE_HTA_PYTHON``; ``<repo>/../hta-venv`` (a venv made
    beside the checkout by hand); ``<repo>/.hta-venv`` (made by ``.ci/install_hta.sh``). A path
    given by the environment variable but missing counts as not found.
    """
    configured = os.environ.get(HTA_PYTHON_ENV)
    candidates = (
        [Path(configured)]
        if configured
        else [
            REPO_ROOT.parent / "hta-venv" / "bin" / "python",
            REPO_ROOT / ".hta-venv" / "bin" / "python",
        ]
    )
    return next((p for p in candidates if p.is_file() and os.access(p, os.X_OK)), None)


class HtaError(RuntimeError):
    """HTA failed on a trace; the message carries the tail of its stderr."""


@functools.lru_cache(maxsize=32)
def _run_cached(python: str, target: tuple[str, ...], timeout_s: float) -> str:
    with tempfile.TemporaryDirectory(prefix="stepscope-hta-") as tmp:
        out = Path(tmp) / "hta.json"
        argv = [python, str(Path(__file__).resolve()), "--out", str(out), *target]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise HtaError(f"HTA failed on {' '.join(target)} (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
        return out.read_text()


def run_hta(
    python: str | os.PathLike[str],
    *,
    trace_dir: str | os.PathLike[str] | None = None,
    trace_files: dict[int, str | os.PathLike[str]] | None = None,
    timeout_s: float = 600.0,
) -> dict[str, object]:
    """HTA's temporal breakdown, comm/comp overlap and idle-time breakdown for some traces.

    Give ``trace_dir`` (a folder holding only rank traces) or ``trace_files`` ({rank: path}).
    Results are cached per (interpreter, traces): HTA takes seconds per big trace, and several
    tests check different numbers of the same trace. Each call returns a fresh dict.
    """
    if (trace_dir is None) == (trace_files is None):
        raise ValueError("give exactly one of trace_dir and trace_files")
    if trace_dir is not None:
        target: tuple[str, ...] = (str(Path(trace_dir).resolve()),)
    else:
        assert trace_files is not None
        target = tuple(
            f"--file={rank}={Path(path).resolve()}" for rank, path in sorted(trace_files.items())
        )
    return json.loads(_run_cached(os.fspath(python), target, timeout_s))


# ---- HTA's side: runs under HTA's interpreter, never imported by tests. ----


def _records(df: object) -> list[dict[str, object]]:
    """A DataFrame as row dicts, numpy scalars and NaN made JSON-plain (NaN becomes null)."""
    return json.loads(df.to_json(orient="records"))  # type: ignore[attr-defined]


def _hta_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Write HTA's breakdowns of traces as JSON.")
    parser.add_argument("--out", required=True, help="where to write the JSON")
    parser.add_argument("--file", action="append", default=[], metavar="RANK=PATH",
                        help="one rank's trace (instead of a trace dir)")
    parser.add_argument("trace_dir", nargs="?", help="a folder holding only rank traces")
    args = parser.parse_args(argv)
    if bool(args.file) == bool(args.trace_dir):
        parser.error("give a trace dir or --file RANK=PATH options, not both")

    from hta.trace_analysis import TraceAnalysis

    if args.trace_dir:
        analysis = TraceAnalysis(trace_dir=args.trace_dir)
    else:
        files = {int(rank): path for rank, path in (f.split("=", 1) for f in args.file)}
        analysis = TraceAnalysis(trace_files=files)
    ranks = sorted(analysis.t.traces)
    idle, _stats = analysis.get_idle_time_breakdown(ranks=ranks, visualize=False)
    result = {
        "ranks": ranks,
        "temporal_breakdown": _records(analysis.get_temporal_breakdown(visualize=False)),
        "comm_comp_overlap": _records(analysis.get_comm_comp_overlap(visualize=False)),
        "idle_time_breakdown": _records(idle),
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(_hta_main(sys.argv[1:]))
