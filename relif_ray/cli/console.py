"""The `relif` console script: make-data, report, audit, export.

Every subcommand module provides `add_parser(subparsers)`; its parser sets `handler`, a
function `(args) -> exit status`. User mistakes (`UserError`) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys

from analysis.report import add_parser as add_report_parser
from relif_ray.cli.audit import add_parser as add_audit_parser
from relif_ray.cli.make_data import add_parser as add_make_data_parser
from relif_ray.errors import UserError
from relif_ray.experiment.export import add_parser as add_export_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relif", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_make_data_parser(subparsers)
    add_report_parser(subparsers)
    add_audit_parser(subparsers)
    add_export_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)  # the parser lists the registered benchmarks
        return args.handler(args)
    except UserError as exc:
        print(f"relif: error: {exc}", file=sys.stderr)
        return 2
