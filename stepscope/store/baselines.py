"""The CI gate's records in a store: named baselines and accepted changes.

``<store>/baselines.json`` maps a name (a branch or tag: ``main``, ``release/2.1``) to the runs
that later comparisons start from: its last ``keep`` runs (default :data:`DEFAULT_KEEP`), because
the spread between runs of the same code is the noise a change must exceed, and one run cannot
show it. ``run`` is the newest of them; ``history`` keeps the earlier choices. ``<store>/acceptances/
<run>.json`` keeps, beside the run, why a known change was accepted. Both are small JSON files
written atomically (:mod:`stepscope.store.atomic`: a temporary file of the writer's own, fsync, rename), so a reader never sees half a file and a
crash leaves the previous version.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

from stepscope.errors import StoreError, UsageError
from stepscope.store.atomic import write_text_atomic
from stepscope.store.location import is_url

BASELINES_FILE = "baselines.json"
ACCEPTANCES_DIR = "acceptances"
RECORDS_VERSION = 1
_NAME = re.compile(r"^[A-Za-z0-9._/-]{1,200}$")
DEFAULT_KEEP = 3
"""Runs a baseline keeps: three runs show the run-to-run spread (two would show it only as one
difference), and a baseline set on every push to main stays that recent."""


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` (:func:`stepscope.store.atomic.write_text_atomic`)."""
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise StoreError(f"{path}: not valid JSON ({exc})") from exc


def _remote_records(url: str) -> Any:
    """``baselines.json`` of a store on object storage, or None when it has none."""
    from stepscope.store.objectstore import RemoteStore

    text = RemoteStore(url).read_text(BASELINES_FILE)
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise StoreError(f"{url}/{BASELINES_FILE}: not valid JSON ({exc})") from exc


def load_baselines(store: Path | str) -> dict[str, dict[str, Any]]:
    """Name -> ``{"run", "runs", "keep", "set_at", "reason", "history"}`` (``runs`` oldest first;
    a file written before baselines kept several runs has ``run`` alone); empty when none was
    ever set."""
    if is_url(store):
        data = _remote_records(str(store))
        if data is None:
            return {}
        path: Path | str = f"{store}/{BASELINES_FILE}"
    else:
        path = Path(store) / BASELINES_FILE
        if not path.exists():
            return {}
        data = _read(path)
    if not isinstance(data, dict) or not isinstance(data.get("baselines"), dict):
        raise StoreError(f"{path}: expected an object with a 'baselines' object")
    return data["baselines"]


def entry_runs(entry: dict[str, Any]) -> list[str]:
    """A baseline's runs, oldest first."""
    runs = entry.get("runs")
    return [str(r) for r in runs] if isinstance(runs, list) and runs else [entry["run"]]


def set_baseline(store: Path | str, name: str, run: str, *, reason: str | None = None,
                 keep: int = DEFAULT_KEEP, append: bool = True) -> dict[str, Any]:
    """Add ``run`` to the baseline ``name`` as its newest run, keeping its last ``keep`` runs
    (``append=False``: ``run`` alone, as after an accepted change, whose older runs measured other
    code); the previous entry goes into its history."""
    if not _NAME.match(name):
        raise UsageError(f"baseline name {name!r}: use letters, digits and . _ / - (a branch or tag name)")
    if keep < 1:
        raise UsageError(f"--keep {keep}: a baseline keeps at least one run")
    baselines = load_baselines(store)
    previous = baselines.get(name)
    history = list(previous.get("history", [])) if previous else []
    if previous:
        history.append({k: previous.get(k) for k in ("run", "set_at", "reason")})
    earlier = [r for r in entry_runs(previous) if r != run] if previous and append else []
    entry = {"run": run, "runs": [*earlier, run][-keep:], "keep": keep, "set_at": _now(), "reason": reason,
             "history": history}
    baselines[name] = entry
    records = {"version": RECORDS_VERSION, "baselines": baselines}
    if is_url(store):  # one PUT: readers see the old object or the new one
        from stepscope.store.objectstore import RemoteStore

        RemoteStore(str(store)).write_text(BASELINES_FILE, json.dumps(records, indent=1, sort_keys=True) + "\n")
    else:
        write_json_atomic(Path(store) / BASELINES_FILE, records)
    return entry


def baseline_run(store: Path | str, name: str) -> str | None:
    """The newest run of baseline ``name``, or None when there is no such baseline."""
    entry = load_baselines(store).get(name)
    return entry["run"] if entry else None


def baseline_runs(store: Path | str, name: str) -> list[str] | None:
    """Every run of baseline ``name``, oldest first, or None when there is no such baseline."""
    entry = load_baselines(store).get(name)
    return entry_runs(entry) if entry else None


def protected_runs(store: Path | str) -> set[str]:
    """Every run some baseline keeps (``prune`` never removes them)."""
    return {run for entry in load_baselines(store).values() for run in entry_runs(entry)}


def record_acceptance(store: Path | str, run: str, reason: str, *, baseline: str | None,
                      compared_to: str | None) -> Path:
    """Keep why ``run``'s change was accepted, beside the run: ``acceptances/<run>.json``."""
    if not reason.strip():
        raise UsageError("--reason must say why the change is accepted")
    path = Path(store) / ACCEPTANCES_DIR / f"{run}.json"
    write_json_atomic(path, {"version": RECORDS_VERSION, "run": run, "reason": reason, "accepted_at": _now(),
                             "baseline": baseline, "previous_baseline_run": compared_to})
    return path


def forget_acceptance(store: Path | str, run: str) -> None:
    """Remove the acceptance record of ``run`` (when the run itself is pruned)."""
    (Path(store) / ACCEPTANCES_DIR / f"{run}.json").unlink(missing_ok=True)
