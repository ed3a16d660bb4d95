"""The CI gate's records in a store: named baselines and accepted changes.

``<store>/baselines.json`` maps a name (a branch or tag: ``main``, ``release/2.1``) to the run
that later comparisons start from, with the history of earlier choices. ``<store>/acceptances/
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
    """Name -> ``{"run", "set_at", "reason", "history"}``; empty when none was ever set."""
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


def set_baseline(store: Path | str, name: str, run: str, *, reason: str | None = None) -> dict[str, Any]:
    """Name ``run`` as the baseline ``name``; the previous run of that name goes into its history."""
    if not _NAME.match(name):
        raise UsageError(f"baseline name {name!r}: use letters, digits and . _ / - (a branch or tag name)")
    baselines = load_baselines(store)
    previous = baselines.get(name)
    history = list(previous.get("history", [])) if previous else []
    if previous:
        history.append({k: previous.get(k) for k in ("run", "set_at", "reason")})
    entry = {"run": run, "set_at": _now(), "reason": reason, "history": history}
    baselines[name] = entry
    records = {"version": RECORDS_VERSION, "baselines": baselines}
    if is_url(store):  # one PUT: readers see the old object or the new one
        from stepscope.store.objectstore import RemoteStore

        RemoteStore(str(store)).write_text(BASELINES_FILE, json.dumps(records, indent=1, sort_keys=True) + "\n")
    else:
        write_json_atomic(Path(store) / BASELINES_FILE, records)
    return entry


def baseline_run(store: Path | str, name: str) -> str | None:
    """The run named by baseline ``name``, or None when there is no such baseline."""
    entry = load_baselines(store).get(name)
    return entry["run"] if entry else None


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
