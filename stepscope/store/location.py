"""Where a store lives: a local folder, or a URL of any filesystem fsspec knows (``s3://``,
``gs://``, ``abfs://``, ``memory://``).

The store's layout is the same everywhere (``<root>/<table>/run=<run>/rank=<rank>/part-*.parquet``);
what differs is how files are listed, read and written. :class:`StoreFiles` answers the catalog's
questions for a local folder; :class:`RemoteStoreFiles` keeps this machine's copy of a URL's
committed parts up to date (``mirror``: one listing, only new or changed parts fetched), which
the catalog then reads like a folder. Other engines (DuckDB through ``register_filesystem``,
Polars, Spark) read the parts in place (docs/SCALE.md); DuckDB's own ``httpfs`` extension is not
needed, and cannot be installed offline. Writing is :mod:`stepscope.store.objectstore`'s.

Credentials and endpoint come from the usual environment: for ``s3://``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``/``AWS_REGION``,
``AWS_PROFILE`` (read by botocore) and ``AWS_ENDPOINT_URL`` (an S3-compatible server: MinIO,
Ceph, moto), passed on explicitly.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError
from stepscope.store.atomic import move_file, temporary_path, write_text_atomic

_URL = re.compile(r"^([a-z][a-z0-9+.-]*)://", re.IGNORECASE)
_PART = re.compile(r"^(?P<table>[a-z_]+)/run=(?P<run>[^/]+)/rank=(?P<rank>-?\d+)/part-(?P<source>[^/.]+)\.parquet$")
_STAMPS = ".stamps.json"
"""The local copy's record of each part's size and ETag when it was fetched."""


def _trace_of(key: str) -> tuple[str, str, str]:
    """(run, rank, source) of a part's key."""
    match = _PART.match(key)
    return match.group("run"), match.group("rank"), match.group("source")


def _stamp(info: dict[str, Any]) -> str:
    return f"{info.get('size')}:{info.get('ETag') or info.get('etag') or info.get('mtime') or ''}"


def is_url(store: object) -> bool:
    """Is ``store`` a URL of a non-local filesystem (``s3://bucket/prefix``)? ``file://`` and
    plain paths are local."""
    if not isinstance(store, str):
        return False
    match = _URL.match(store)
    return bool(match) and match.group(1).lower() != "file"


def store_location(text: str) -> Path | str:
    """``--store``'s type: a URL stays text (``Path`` would fold its ``//``), the rest is a path."""
    if text.lower().startswith("file://"):
        return Path(text[len("file://"):])
    return text.rstrip("/") if is_url(text) else Path(text)


def storage_options(protocol: str) -> dict[str, Any]:
    """Options for fsspec from the environment: for S3, the endpoint of an S3-compatible server."""
    if protocol in ("s3", "s3a") and os.environ.get("AWS_ENDPOINT_URL"):
        return {"client_kwargs": {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}}
    return {}


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path inside it (no protocol). Listing caches are
    off: a commit decides on what the store holds now."""
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover - fsspec comes with the [s3] extra
        raise UsageError(f"{url}: a store on object storage needs fsspec (pip install 'stepscope[s3]')") from exc
    protocol = _URL.match(url).group(1).lower()
    try:
        fs, path = fsspec.core.url_to_fs(url, use_listings_cache=False, **storage_options(protocol))
    except (ImportError, ValueError) as exc:
        raise UsageError(f"{url}: no filesystem for {protocol}:// ({exc}; for s3:// "
                         "pip install 'stepscope[s3]')") from exc
    return fs, path.rstrip("/")


class StoreFiles:
    """A local store folder's files."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.url = str(self.root)

    def exists(self) -> bool:
        return self.root.is_dir()

    def part_files(self, table: str) -> list[str]:
        """Every Parquet part of ``table`` (committed or not), as paths DuckDB opens."""
        return sorted(str(p.resolve()) for p in (self.root / table).glob("**/*.parquet"))

    def has_parts(self, table: str) -> bool:
        return any((self.root / table).glob("run=*/rank=*/*.parquet"))

    def glob(self, table: str) -> str:
        """The glob of ``table``'s parts, for ``read_parquet``."""
        return str(self.root / table / "**" / "*.parquet")

    def cache_root(self) -> Path:
        """Where the analysis layer caches this store's frames."""
        return self.root


class RemoteStoreFiles:
    """A store's files behind a URL, through its fsspec filesystem."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.fs, self.base = filesystem(self.url)
        self.protocol = self.url.split("://", 1)[0]

    def exists(self) -> bool:
        try:
            return bool(self.fs.exists(self.base)) and bool(self.fs.ls(self.base))
        except (FileNotFoundError, PermissionError):
            return False

    def cache_root(self) -> Path:
        """A folder of this machine's (the store is read from a laptop; its frames are kept
        there): ``$XDG_CACHE_HOME/stepscope/stores/<hash of the URL>``."""
        home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return home / "stepscope" / "stores" / hashlib.sha256(self.url.encode()).hexdigest()[:16]

    def mirror(self) -> Path:
        """Bring this machine's copy of the store's committed parts up to date, and return it.

        One listing of the store (sizes and ETags), then only the parts that are new or changed
        are downloaded (a part's key names its trace, so a part once fetched is rarely fetched
        again); parts no longer in the store are removed from the copy. Uncommitted parts (no
        ``sources`` object for their trace) are not fetched. Queries then read local files:
        through fsspec every query would list and open every part again, ~100x slower.
        """
        local = self.cache_root() / "parts"
        listing = self.fs.find(self.base, detail=True)
        parts = {path[len(self.base) + 1:]: info for path, info in listing.items()
                 if path.endswith(".parquet") and _PART.match(path[len(self.base) + 1:])}
        committed = {_trace_of(key) for key in parts if key.startswith("sources/")}
        wanted = {key: info for key, info in parts.items() if _trace_of(key) in committed}
        stamps_file = local / _STAMPS
        try:
            stamps = json.loads(stamps_file.read_text())
        except (OSError, ValueError):
            stamps = {}
        fetch = [key for key, info in wanted.items()
                 if stamps.get(key) != _stamp(info) or not (local / key).is_file()]
        for key in set(stamps) - set(wanted):
            (local / key).unlink(missing_ok=True)
        if fetch:  # to temporary names, then renamed: another process reading the copy sees whole files
            temporary = {key: temporary_path(local / key) for key in fetch}
            for path in temporary.values():
                path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.fs.get([f"{self.base}/{key}" for key in fetch], [str(temporary[key]) for key in fetch])
                for key, path in temporary.items():
                    move_file(path, local / key)
            finally:
                for path in temporary.values():
                    path.unlink(missing_ok=True)
        local.mkdir(parents=True, exist_ok=True)
        write_text_atomic(stamps_file, json.dumps({key: _stamp(info) for key, info in wanted.items()}))
        return local


def store_files(store: Path | str) -> StoreFiles:
    """The files of the store at ``store`` (a folder or a URL)."""
    return RemoteStoreFiles(store) if is_url(store) else StoreFiles(store)
