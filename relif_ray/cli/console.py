"""The `relif` console script: sweep, make-data, methods, audit, report, export.

Every subcommand module provides `add_parser(subparsers)`; its parser sets `handler`, a
function `(args) -> exit status`. `relif sweep` is the sweep front door
(`relif_ray.cli.sweep.main`), which parses its own flags: their defaults depend on --dataset.
User mistakes (`UserError`) print one line and exit 2 (`relif_ray.cli.parsing.run_command`).
"""

from __future__ import annotations

import argparse

from relif_ray.cli import audit, export, make_data, methods, report, sweep
from relif_ray.cli.parsing import OneLineParser, run_command

PROG = "relif"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    subparsers.add_parser(
        "sweep",
        add_help=False,
        help="a Ray Tune sweep on a registered data set (relif sweep --dataset NAME --help)",
    )
    for command in (make_data, methods, report, audit, export):
        command.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    def command() -> int:
        parser = build_parser()  # the parser lists the registered benchmarks
        args, rest = parser.parse_known_args(argv)
        if args.command == "sweep":
            return sweep.main(rest, prog=f"{PROG} sweep", retry=[PROG, "sweep"])
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return args.handler(args)

    return run_command(PROG, command)
