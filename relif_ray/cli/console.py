"""The `relif` console script: sweep, make-data, methods, architectures, audit, report, export.

Every subcommand module provides `add_parser(subparsers)`; its parser sets `handler`, a
function `(args) -> exit status`. `relif sweep` is the sweep front door
(`relif_ray.cli.sweep.main`), which parses its own flags: their defaults depend on --dataset.
User mistakes (`UserError`) print one line and exit 2 (`relif_ray.cli.parsing.run_command`).

A command imports only its own module: `relif export` or `relif audit` need neither torch nor
Ray, and importing every subcommand's dependencies cost about 3 s of CPU before any command
ran. Without a known command first (`relif --help`, a typo) every module is imported, so the
usage lists each command with its help.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

from relif_ray.cli.parsing import OneLineParser, run_command

PROG = "relif"
SWEEP_HELP = "a Ray Tune sweep on a registered data set (relif sweep --dataset NAME --help)"
COMMAND_MODULES = {
    "sweep": "relif_ray.cli.sweep",
    "make-data": "relif_ray.cli.make_data",
    "methods": "relif_ray.cli.methods",
    "architectures": "relif_ray.cli.architectures",
    "report": "relif_ray.cli.report",
    "audit": "relif_ray.cli.audit",
    "export": "relif_ray.cli.export",
}
"""Each subcommand and the module that defines it, in the order `relif --help` lists them."""


def command_modules(argv: list[str]) -> dict[str, ModuleType]:
    """The module of the command `argv` names first, else of every command."""
    chosen = [argv[0]] if argv and argv[0] in COMMAND_MODULES else list(COMMAND_MODULES)
    return {name: importlib.import_module(COMMAND_MODULES[name]) for name in chosen}


def build_parser(modules: dict[str, ModuleType]) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, module in modules.items():
        if name == "sweep":
            subparsers.add_parser(name, add_help=False, help=SWEEP_HELP)
        else:
            module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    def command() -> int:
        given = list(sys.argv[1:] if argv is None else argv)
        modules = command_modules(given)
        parser = build_parser(modules)  # make-data lists the registered benchmarks
        args, rest = parser.parse_known_args(given)
        if args.command == "sweep":
            return modules["sweep"].main(rest, prog=f"{PROG} sweep", retry=[PROG, "sweep"])
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return args.handler(args)

    return run_command(PROG, command)
