"""``stepscope compare BASELINE CANDIDATE [CANDIDATE ...] [--store DIR]``: the CI gate.

BASELINE and CANDIDATE are each a baseline name or run id in ``--store``, a store folder
(``DIR`` holding one run, ``DIR::RUN``, or ``DIR::NAME`` for a baseline name of that store), or
trace files/folders ingested on the fly. A baseline name stands for every run it keeps; several
CANDIDATEs are runs of the same code (a benchmark run more than once): the spread between the runs
of either side is the noise a change must exceed. Exit code:
0 within budget, 1 regression, 2 usage error, 3 unreadable input, 4 inconclusive (not comparable),
5 internal error. When BASELINE does not exist yet (the first run of a branch) the outcome is
``no_baseline``, which exits as ``--missing-baseline`` says (default ``pass``: 0), and the
Markdown, JSON and JUnit reports are written all the same, saying so.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import TYPE_CHECKING
from stepscope.store.location import store_location

if TYPE_CHECKING:
    from stepscope.analysis.compare import Budget, Comparison, Verdict
    from stepscope.commands._runs import RunRef

FORMATS = ("table", "markdown", "json")
MISSING_BASELINE_CHOICES = ("pass", "fail", "inconclusive")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("baseline", help="baseline name, run id, store folder (DIR or DIR::RUN) or trace folder")
    parser.add_argument("candidate", nargs="+",
                        help="run id, store folder or trace folder to judge; several: runs of the same code")
    parser.add_argument("--store", type=store_location, help="store (folder or URL) holding the runs and baselines.json")
    parser.add_argument("--fail-on", action="append", default=[], metavar="METRIC:+N%",
                        help="budget, e.g. step_time:+5%%, peak_memory:+10%%, comm_exposed:+2ms, busbw:-10%% "
                             "(repeatable; overrides the config file and the defaults per metric)")
    parser.add_argument("--floor", action="append", default=[], metavar="METRIC:AMOUNT",
                        help="absolute floor below which no change of METRIC fails, e.g. step_time:1ms, "
                             "peak_memory:64MiB (defaults: 0.5 ms, 16 MiB, 1 GB/s)")
    parser.add_argument("--missing-baseline", choices=MISSING_BASELINE_CHOICES, default="pass",
                        help="outcome when BASELINE does not exist yet: pass (exit 0, the default), fail (1) "
                             "or inconclusive (4); the reports say 'no baseline yet' in every case")
    parser.add_argument("--config", type=Path, help="stepscope.toml or pyproject.toml (default: the current "
                                                    "folder's stepscope.toml, else its pyproject.toml)")
    parser.add_argument("--alpha", type=float, help="significance level of the Mann-Whitney U test over the "
                                                    "runs' values, reported beside the decision (default 0.05)")
    parser.add_argument("--format", choices=FORMATS, default="table", help="what to print on stdout")
    parser.add_argument("--markdown", type=Path, metavar="FILE", help="also write the Markdown report here "
                                                                      "(e.g. $GITHUB_STEP_SUMMARY)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the JSON report here")
    parser.add_argument("--junit", type=Path, metavar="FILE", help="write JUnit XML, one test case per budget")


@dataclass(frozen=True)
class Settings:
    """What the gate judges with: budgets, each metric's floor, the noise test's alpha."""

    budgets: list[Budget]
    floors: dict[str, float]
    alpha: float


def settings(fail_on: list[str], floors: list[str], config: Path | None, alpha: float | None,
             *, defaults: bool = True) -> Settings:
    """Budgets (defaults < config file < ``fail_on``; only ``fail_on`` when not ``defaults``),
    floors (defaults < config ``[floors]`` < ``floors``) and alpha (config < ``alpha``)."""
    from stepscope.analysis.compare import ALPHA, merge_budgets
    from stepscope.analysis.compare.budgets import floors as floor_table
    from stepscope.commands._config import config_alpha, config_budgets, config_floors, load_config
    from stepscope.errors import UsageError

    table, where = load_config(config)
    budgets = merge_budgets(config_budgets(table, where), fail_on, defaults=defaults)
    alpha = alpha if alpha is not None else config_alpha(table, where) or ALPHA
    if not 0 < alpha < 1:
        raise UsageError(f"--alpha {alpha}: must be between 0 and 1")
    return Settings(budgets, floor_table([*config_floors(table, where), *floors]), alpha)


def resolve_side(spec: str, store: Path | None, stack: contextlib.ExitStack) -> list[RunRef]:
    """The runs ``spec`` names: every run a baseline name keeps (in ``store``, or ``DIR::NAME``
    of the store ``DIR``), oldest first, else the one run :func:`~stepscope.commands._runs.resolve`
    finds."""
    from stepscope.commands._runs import RunRef, resolve
    from stepscope.store.baselines import baseline_runs
    from stepscope.store.runs import stored_runs

    folder, sep, name = spec.partition("::")
    where, named = (Path(folder), name) if sep else (store, spec)
    if where is not None:
        runs = baseline_runs(where, named)
        if runs:
            have = set(stored_runs(where))
            kept = [RunRef(where, r) for r in runs if r in have]
            if kept:
                return kept
    return [resolve(spec, store, stack)]


def gate(baseline: str, candidate: str | Sequence[str], store: Path | None, fail_on: list[str],
         config: Path | None, alpha: float | None, *, floors: Sequence[str] = (), defaults: bool = True,
         missing_baseline: str | None = None) -> tuple[Comparison, Verdict]:
    """Resolve, compare and judge: returns ``(comparison, verdict)``. Shared with the pytest
    plugin and ``report``. ``candidate``: one spec or several (runs of the same code). With
    ``missing_baseline`` (a :data:`MISSING_BASELINE_CHOICES` value) a baseline that does not exist
    gives the ``no_baseline`` verdict; without, it is an error."""
    from stepscope.analysis.compare import verdict
    from stepscope.analysis.compare.comparison import compare_sides, profiles, side_source, without_baseline
    from stepscope.commands._runs import NotFound, resolve
    from stepscope.store import open_store

    chosen = settings(fail_on, list(floors), config, alpha, defaults=defaults)
    specs = [candidate] if isinstance(candidate, str) else list(candidate)
    with contextlib.ExitStack() as stack:
        cands = [resolve(spec, store, stack) for spec in specs]
        opened: dict[Path, object] = {}

        def side(refs: list[RunRef]) -> list[tuple[object, str]]:
            for ref in refs:
                if ref.store not in opened:
                    opened[ref.store] = stack.enter_context(open_store(ref.store))
            return [(opened[ref.store], ref.run) for ref in refs]

        try:
            bases = resolve_side(baseline, store, stack)
        except NotFound as exc:
            if missing_baseline is None:
                raise
            cand_side = side(cands)
            comparison = without_baseline(profiles(cand_side, side_source(cand_side)),  # type: ignore[arg-type]
                                          f"no baseline yet: {exc}", alpha=chosen.alpha)
        else:
            comparison = compare_sides(side(bases), side(cands), alpha=chosen.alpha)  # type: ignore[arg-type]
    return comparison, verdict(comparison, chosen.budgets, chosen.floors,
                               missing_baseline=missing_baseline or "pass")


def run(args: argparse.Namespace) -> int:
    from stepscope.render.compare_json import render_json
    from stepscope.render.compare_markdown import render_markdown
    from stepscope.render.compare_text import render_text
    from stepscope.render.junit import render_junit
    from stepscope.render.table import terminal_width

    comparison, result = gate(args.baseline, args.candidate, args.store, args.fail_on, args.config, args.alpha,
                              floors=args.floor, missing_baseline=args.missing_baseline)
    renderers = {"table": lambda c, v: render_text(c, v, terminal_width()), "markdown": render_markdown,
                 "json": render_json}
    print(renderers[args.format](comparison, result), end="")
    for path, render in ((args.markdown, render_markdown), (args.json, render_json), (args.junit, render_junit)):
        if path is not None:
            path.write_text(render(comparison, result), encoding="utf-8")
    return result.exit_code
