"""The ``stepscope`` command: a registry of subcommands, one module each under ``commands/``.

``main(argv) -> int`` turns errors into one line and an exit code, so every subcommand shares
the same contract (:data:`stepscope.errors.EXIT_CODES`: 0 ok, 1 regression, 2 usage, 3 bad
input, 4 inconclusive, 5 internal error). A :class:`~stepscope.errors.StepscopeError` prints its
message; any other exception is stepscope's own failure and prints ``internal error: ...``;
``--debug`` (or ``STEPSCOPE_DEBUG=1``) adds the traceback. Subcommand modules are imported only
when chosen, to keep start-up lean.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import traceback
from importlib import import_module
from typing import Sequence

from stepscope import __version__
from stepscope.errors import EXIT_CODES, InternalError, StepscopeError

DESCRIPTION = ("Where every millisecond and every byte of a PyTorch training step goes: ingest torch.profiler "
               "traces into a Parquet store, see what bounds each step, and gate regressions in CI.")

COMMANDS: dict[str, str] = {
    "ingest": "Ingest Kineto traces (*.json, *.json.gz) into a store, as the ranks of one run.",
    "runs": "List the runs in a store.",
    "sql": "Run read-only SQL over the store's views.",
    "summary": "Where each step's time goes, per rank: breakdown, totals, kernels, findings.",
    "demo": "Ingest the bundled sample traces into a local store and show what they hold.",
    "dashboard": "Serve the web dashboard on a store (Streamlit, 127.0.0.1 by default).",
    "compare": "Compare two runs against budgets (exit 0 pass, 1 regression, 4 inconclusive).",
    "accept": "Accept a run's intended change: keep the reason and make it the baseline.",
    "baseline": "Name the run that comparisons start from, per branch or tag.",
    "report": "Write one self-contained HTML report of a run (and its comparison with a baseline).",
    "prune": "Remove old runs from a store kept between CI runs (baselines are kept).",
    "migrate": "Bring a store written by an older stepscope up to this one's schema version.",
    "whatif": "Replay a run's steps with changed durations: the predicted step, with its error bar.",
}
"""Subcommand name -> one-line help. The module is ``stepscope.commands.<name>``."""

DEBUG_ENV = "STEPSCOPE_DEBUG"
"""Set to 1 to print the traceback of every error (as ``--debug``)."""


def _module(name: str):
    return import_module(f"stepscope.commands.{name.replace('-', '_')}")


def _epilog() -> str:
    codes = "\n".join(f"  {code}  {meaning.replace('`', '')}" for code, meaning in EXIT_CODES.items())
    return (f"exit codes:\n{codes}\n\n'stepscope COMMAND --help' shows a command's options. Documentation: "
            "README.md and docs/ (ci.md for the CI gate).")


def build_parser(selected: str | None) -> argparse.ArgumentParser:
    """The parser; only the selected subcommand's module is imported to add its arguments."""
    parser = argparse.ArgumentParser(prog="stepscope", description=textwrap.fill(DESCRIPTION, 88),
                                     epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"stepscope {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help=f"print the traceback of an error (also: {DEBUG_ENV}=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == selected:
            _module(name).add_arguments(command_parser)
    return parser


def _debug(args: argparse.Namespace | None) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(selected if selected in COMMANDS else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return _module(args.command).run(args)
    except KeyboardInterrupt:
        print("stepscope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except InternalError as exc:
        return _failed(args, f"internal error: {exc}", exc.exit_code, internal=True)
    except StepscopeError as exc:
        return _failed(args, str(exc), exc.exit_code, internal=False)
    except Exception as exc:  # noqa: BLE001 - the one place that turns stepscope's own failures into exit 5
        return _failed(args, f"internal error: {type(exc).__name__}: {exc}", InternalError.exit_code, internal=True)


def _failed(args: argparse.Namespace, message: str, code: int, *, internal: bool) -> int:
    """Print the error as one line (and the traceback when debugging); return its exit code."""
    debug = _debug(args)
    if debug:
        traceback.print_exc()
    hint = f" (run with --debug or {DEBUG_ENV}=1 for the traceback)" if internal and not debug else ""
    print(f"stepscope {args.command}: {message}{hint}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
