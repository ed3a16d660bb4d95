"""``stepscope compare BASELINE CANDIDATE [--store DIR]``: the CI gate.

BASELINE and CANDIDATE are each a baseline name or run id in ``--store``, a store folder
(``DIR`` holding one run, or ``DIR::RUN``), or trace files/folders ingested on the fly. Exit code:
0 within budget, 1 regression, 2 usage error, 3 unreadable input, 4 inconclusive (not comparable).
"""

from __future__ import annotations

import argparse
from pathlib import Path

FORMATS = ("table", "markdown", "json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("baseline", help="baseline name, run id, store folder (DIR or DIR::RUN) or trace folder")
    parser.add_argument("candidate", help="run id, store folder or trace folder to judge")
    parser.add_argument("--store", type=Path, help="store holding the runs and baselines.json")
    parser.add_argument("--fail-on", action="append", default=[], metavar="METRIC:+N%",
                        help="budget, e.g. step_time:+5%%, peak_memory:+10%%, comm_exposed:+2ms (repeatable; "
                             "overrides the config file and the defaults per metric)")
    parser.add_argument("--config", type=Path, help="stepscope.toml or pyproject.toml (default: the current "
                                                    "folder's stepscope.toml, else its pyproject.toml)")
    parser.add_argument("--alpha", type=float, help="significance level of the noise test (default 0.05)")
    parser.add_argument("--format", choices=FORMATS, default="table", help="what to print on stdout")
    parser.add_argument("--markdown", type=Path, metavar="FILE", help="also write the Markdown report here "
                                                                      "(e.g. $GITHUB_STEP_SUMMARY)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the JSON report here")
    parser.add_argument("--junit", type=Path, metavar="FILE", help="write JUnit XML, one test case per budget")


def gate(baseline: str, candidate: str, store: Path | None, fail_on: list[str], config: Path | None,
         alpha: float | None):
    """Resolve, compare and judge: returns ``(comparison, verdict)``. Shared with the pytest plugin."""
    from stepscope.analysis.compare import ALPHA, compare_runs, merge_budgets, verdict
    from stepscope.commands._config import config_alpha, config_budgets, load_config
    from stepscope.commands._runs import resolved
    from stepscope.errors import UsageError
    from stepscope.store import open_store

    settings, where = load_config(config)
    budgets = merge_budgets(config_budgets(settings, where), fail_on)
    alpha = alpha if alpha is not None else config_alpha(settings, where) or ALPHA
    if not 0 < alpha < 1:
        raise UsageError(f"--alpha {alpha}: must be between 0 and 1")
    with resolved([baseline, candidate], store) as (base, cand):
        with open_store(base.store) as base_store, open_store(cand.store) as cand_store:
            comparison = compare_runs(base_store, base.run, cand_store, cand.run, alpha=alpha)
    return comparison, verdict(comparison, budgets)


def run(args: argparse.Namespace) -> int:
    from stepscope.render.compare_json import render_json
    from stepscope.render.compare_markdown import render_markdown
    from stepscope.render.compare_text import render_text
    from stepscope.render.junit import render_junit

    comparison, result = gate(args.baseline, args.candidate, args.store, args.fail_on, args.config, args.alpha)
    renderers = {"table": render_text, "markdown": render_markdown, "json": render_json}
    print(renderers[args.format](comparison, result), end="")
    for path, render in ((args.markdown, render_markdown), (args.json, render_json), (args.junit, render_junit)):
        if path is not None:
            path.write_text(render(comparison, result), encoding="utf-8")
    return result.exit_code
