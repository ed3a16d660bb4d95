"""The ``stepscope`` command: a registry of subcommands, one module each under ``commands/``.

``main(argv) -> int`` turns ``StepscopeError`` into a one-line message and its exit code, so
every subcommand shares the same exit-code contract (0 ok, 1 regression, 2 usage, 3 bad input,
4 inconclusive). Subcommand modules are imported only when chosen, to keep start-up lean.
"""

from __future__ import annotations

import argparse
import sys
from importlib import import_module
from typing import Sequence

from stepscope import __version__
from stepscope.errors import StepscopeError

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
}
"""Subcommand name -> one-line help. The module is ``stepscope.commands.<name>``."""


def _module(name: str):
    return import_module(f"stepscope.commands.{name.replace('-', '_')}")


def build_parser(selected: str | None) -> argparse.ArgumentParser:
    """The parser; only the selected subcommand's module is imported to add its arguments."""
    parser = argparse.ArgumentParser(prog="stepscope", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"stepscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == selected:
            _module(name).add_arguments(command_parser)
    return parser


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
    except StepscopeError as exc:
        print(f"stepscope {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("stepscope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
