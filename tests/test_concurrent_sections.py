"""The summary's sections computed on two threads: the same answers as one thread, inputs the
sections share computed once (the store's memo), and a failure raised as it is."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.absent import Absent, jsonable
from stepscope.analysis.sections import SECTIONS, Section, all_sections, compute_sections
from stepscope.store import open_store
from stepscope.store.catalog import Store

WAIT_S = 60.0
"""How long a test waits for another thread to reach a point (a bound for a hang, not a timing)."""


class _WithoutSessions:
    """A store that cannot open twin sessions: :func:`compute_sections` then computes every
    section in report order on the calling thread, as it did before the threads."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name == "session":
            raise AttributeError(name)
        return getattr(self._store, name)


def _sections_json(store: Any, run: str) -> dict[str, Any]:
    results = compute_sections(store, run)
    return {s.name: jsonable(results[s.name] if isinstance(results[s.name], Absent) else s.to_json(results[s.name]))
            for s in all_sections()}


@pytest.mark.parametrize("run", ["gloo-3ranks-late", "pp-1f1b-3stages-slow"])
def test_sections_on_threads_answer_what_one_thread_answers(sample_run: Callable[[str], Path], run: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Every section's JSON, computed on two threads (each with a twin session), equals the JSON
    computed in order on one thread from a store opened afresh: a section that read another's
    half-built input, or a twin that missed a table materialised by the other, would differ.
    The runs are real recordings with cross-rank sections (lateness, critical path, pipeline)."""
    monkeypatch.setenv("STEPSCOPE_NO_CACHE", "1")
    with open_store(sample_run(run)) as store:
        threaded = _sections_json(store, run)
    with open_store(sample_run(run)) as store:
        in_order = _sections_json(_WithoutSessions(store), run)
    assert threaded == in_order
    assert any(not isinstance(value, str) for value in threaded.values())


def test_a_failing_section_is_raised_as_it_is(sample_run: Callable[[str], Path],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A section that raises makes :func:`compute_sections` raise the same exception (not a
    wrapper from the thread pool), and the store still answers afterwards."""

    class Boom(RuntimeError):
        pass

    def boom(store: Any, run: str, ranks: Any) -> object:
        raise Boom("section failed")

    monkeypatch.setitem(SECTIONS, "boom", Section("boom", 10_000, boom, lambda r: r, ""))
    monkeypatch.setenv("STEPSCOPE_NO_CACHE", "1")
    with open_store(sample_run("gloo-3ranks-late")) as store:
        with pytest.raises(Boom, match="section failed"):
            compute_sections(store, "gloo-3ranks-late")
        assert store.sql("SELECT count(*) AS n FROM runs").column("n")[0].as_py() >= 1


def _waiting_on(store: Store, key: tuple[Any, ...], computes: list[str]) -> None:
    """Return once a second thread waits for ``key``'s computation to end, or fail when it
    computed ``key`` itself (``computes`` grew past the first) or did neither in time."""
    for _ in range(int(WAIT_S / 0.01)):
        if len(computes) > 1:
            pytest.fail(f"the second thread computed {key} again: {computes}")
        running = getattr(store._shared, "computing", {}).get(key)
        if running is not None and running._cond._waiters:  # a thread waits on the event
            return
        threading.Event().wait(0.01)
    pytest.fail(f"no second thread came to wait for {key}")


def _in_thread(call: Callable[[], object], out: dict[str, object], name: str) -> threading.Thread:
    def run() -> None:
        try:
            out[name] = call()
        except Exception as exc:  # the test inspects it
            out[name] = exc

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


def _race(store: Store, key: tuple[Any, ...], first: Callable[[], object],
          second: Callable[[], object]) -> tuple[dict[str, object], list[str]]:
    """Thread "one" asks ``store``'s memo for ``key`` with ``first``, which blocks until thread
    "two" (a twin) asks for the same key with ``second`` and waits; then ``first`` ends. Returns
    each thread's outcome and which computations ran, in order."""
    computes: list[str] = []
    release = threading.Event()
    out: dict[str, object] = {}
    twin = store.session()

    def blocking_first() -> object:
        computes.append("first")
        release.wait(WAIT_S)
        return first()

    def counted_second() -> object:
        computes.append("second")
        return second()

    one = _in_thread(lambda: store.memo(key, blocking_first), out, "one")
    while not computes:
        threading.Event().wait(0.01)
    two = _in_thread(lambda: twin.memo(key, counted_second), out, "two")
    try:
        _waiting_on(store, key, computes)
    finally:
        release.set()
        one.join(WAIT_S)
        two.join(WAIT_S)
    return out, computes


def test_a_key_being_computed_is_awaited_not_computed_twice(sample_run: Callable[[str], Path]) -> None:
    """Two twins ask the memo for the same key while the first computes it: the second waits and
    gets the first's value, computed once (the sections on two threads share the matched
    collectives and the step breakdown, whose computation is most of a cold summary)."""
    with open_store(sample_run("gloo-3ranks-late")) as store:
        out, computes = _race(store, ("test", "shared input"), lambda: ["the value"], lambda: ["another"])
    assert computes == ["first"]
    assert out["one"] is out["two"] == ["the value"]


def test_a_failed_computation_is_computed_by_the_thread_that_waited(sample_run: Callable[[str], Path]) -> None:
    """When the computation a twin waits for fails, the failure goes to the thread that ran it and
    the waiting twin computes the key itself: nothing is memoised from a failure."""
    key = ("test", "failing input")

    def failing() -> object:
        raise ValueError("the input could not be computed")

    with open_store(sample_run("gloo-3ranks-late")) as store:
        out, computes = _race(store, key, failing, lambda: ["computed again"])
        assert isinstance(out["one"], ValueError)
        assert out["two"] == ["computed again"] and computes == ["first", "second"]
        assert store.memo(key, lambda: pytest.fail("memoised value lost")) == ["computed again"]
        assert key not in store._shared.computing
