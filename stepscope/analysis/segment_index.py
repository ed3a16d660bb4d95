"""A run's ``rank_segments`` held as arrays, to cut any stretch of a rank's time line into parts.

The critical path cuts each of its pieces, and the replay every host stretch between two marks
of every rank of every step (tens of thousands of cuts on a 64-rank run, each spanning up to
thousands of stretches): a Python loop over the stretches, after reading millions of them into
Python lists, cost the critical path and the replay seconds of CPU per run (64 copies of
``df_index_resolver``, measured without a profiler: the unchanged replay 4.0 s, 1.9 s here). Here each (rank, breakdown) keeps its stretches as NumPy arrays
sorted by start, read from Arrow without a Python object per row, and a cut sums the stretches
it overlaps per part in C (``numpy.bincount``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from stepscope.analysis.sections import SQLStore
from stepscope.store.rankstats.parts import GPU, HOST

BREAKDOWNS = {"gpu": GPU, "host": HOST}
PARTS = tuple(dict.fromkeys(p.name for b in BREAKDOWNS.values() for p in b.parts[:-1]))
"""The parts a stretch can have, each a code (its index): every breakdown's exclusive parts but the
last, which is what no stretch covers (:meth:`Segments.cut` gives it the rest)."""


class _Lane:
    """One (rank, breakdown)'s stretches: starts, ends and part codes, sorted by start."""

    __slots__ = ("starts", "ends", "codes")

    def __init__(self, starts: np.ndarray, ends: np.ndarray, codes: np.ndarray) -> None:
        self.starts, self.ends, self.codes = starts, ends, codes


_EMPTY = _Lane(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64))


class Segments:
    """A run's ``rank_segments`` by (rank, breakdown), to cut stretches into parts: read per rank
    when first cut (a critical path touches a few ranks), or for many ranks at once (:meth:`load`,
    the replay)."""

    def __init__(self, store: SQLStore, run: str, ranks: Sequence[int]) -> None:
        self._store, self._run = store, run
        self._lanes: dict[tuple[int, str], _Lane] = {}
        self._loaded: set[int] = set()

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (the dashboard caches section results): every rank read, without the store."""
        return {"_store": None, "_run": self._run, "_lanes": self._lanes, "_loaded": self._loaded}

    def load(self, ranks: Sequence[int]) -> None:
        """Read the stretches of ``ranks`` not read yet, in one query."""
        wanted = sorted(set(int(r) for r in ranks) - self._loaded)
        if not wanted or self._store is None:
            return
        rows = self._store.sql(
            "SELECT rank, breakdown = 'gpu' AS gpu, list_position($parts, part) - 1 AS code, s0, s1 "
            "FROM rank_segments WHERE run = $run AND list_contains($ranks::INTEGER[], rank) "
            "AND list_contains($parts, part) ORDER BY rank, gpu, s0",
            {"run": self._run, "ranks": wanted, "parts": list(PARTS)})
        self._loaded.update(wanted)
        if not rows.num_rows:
            return
        rank, gpu, code, s0, s1 = (rows.column(c).to_numpy() for c in ("rank", "gpu", "code", "s0", "s1"))
        key = rank.astype(np.int64) * 2 + gpu
        bounds = [0, *(np.flatnonzero(np.diff(key)) + 1).tolist(), len(key)]
        for lo, hi in zip(bounds, bounds[1:]):
            self._lanes[(int(rank[lo]), "gpu" if gpu[lo] else "host")] = _Lane(
                s0[lo:hi].astype(np.int64), s1[lo:hi].astype(np.int64), code[lo:hi].astype(np.int64))

    def cut(self, rank: int, breakdown: str, t0: int, t1: int, shift: int = 0) -> dict[str, int]:
        """Part -> ns of [t0, t1) (aligned; ``shift`` back to the rank's clock) on ``rank``: what
        each stretch starting before the end overlaps, from the last one starting before the
        start on (a breakdown's exclusive parts do not overlap); the rest is the breakdown's last
        part (nothing claimed it)."""
        last = BREAKDOWNS[breakdown].parts[-1].name
        if rank not in self._loaded:
            self.load([rank])
        lane = self._lanes.get((rank, breakdown), _EMPTY)
        a, b = t0 + shift, t1 + shift
        first = max(int(np.searchsorted(lane.starts, a, "left")) - 1, 0)
        stop = int(np.searchsorted(lane.starts, b, "left"))
        out: dict[str, int] = {}
        covered = 0
        if stop > first:
            overlap = np.minimum(lane.ends[first:stop], b) - np.maximum(lane.starts[first:stop], a)
            positive = overlap > 0
            codes = lane.codes[first:stop][positive]
            sums = np.bincount(codes, weights=overlap[positive], minlength=len(PARTS))
            # parts in the order they first occur in the stretch, as a walk along it meets them
            present, first_seen = np.unique(codes, return_index=True)
            for index in present[np.argsort(first_seen)]:
                ns = int(round(sums[index]))
                out[PARTS[index]] = ns
                covered += ns
        if b - a - covered > 0:
            out[last] = out.get(last, 0) + b - a - covered
        return out
