"""`relif report EXP [EXP ...] --out DIR`: the command line of `analysis.write_report` (the
paper's tables and figures for experiment directories, and `report.md`)."""

from __future__ import annotations

import argparse
import sys

from analysis import delta as delta_options
from analysis.delta import DISTRIBUTIONS
from analysis.experiment import load
from analysis.report import ReportOptions, write_report
from analysis.results import SENSITIVITY_DELTAS, SPLITS
from analysis.sections import running_note
from analysis.tables import CISettings
from relif_ray.audit import check_delta
from relif_ray.cli.parsing import add_audit_flags, audit_settings, parse_floats
from relif_ray.errors import UserError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `relif report`."""
    parser = subparsers.add_parser(
        "report",
        help="tables and figures for experiment directories",
        description="Audit every trial under one held-fixed delta_ref and write the paper's "
        "tables (Markdown, LaTeX, CSV), figures and report.md. Delta options may be repeated; "
        "the first is the primary delta_ref (Pareto front, drift, certificate).",
    )
    parser.add_argument(
        "experiments",
        nargs="+",
        help="experiment directories: paths or file://, s3://, gs:// URIs (S3-compatible "
        "stores elsewhere: set AWS_ENDPOINT_URL)",
    )
    parser.add_argument("--out", required=True, help="output folder for the report")
    add_delta_flags(parser)
    parser.add_argument(
        "--split",
        choices=SPLITS,
        help="split audited and reported (default: test if present, else val)",
    )
    add_audit_flags(parser)
    parser.add_argument(
        "--sensitivity-deltas",
        default=",".join(f"{d:g}" for d in SENSITIVITY_DELTAS),
        help="deltas of the sensitivity table (comma-separated)",
    )
    parser.add_argument(
        "--drift-baseline",
        metavar="METHOD",
        help="method the induced-threshold drift is compared to "
        "(default: relif if present, else the first method)",
    )
    ci = CISettings()
    parser.add_argument(
        "--n-boot",
        type=int,
        default=ci.n_boot,
        help=f"bootstrap replicates for Bias intervals (0: none; {ci.n_boot})",
    )
    parser.add_argument(
        "--ci-level", type=float, default=ci.level, help=f"interval level ({ci.level:g})"
    )
    parser.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
    parser.set_defaults(handler=run_report)


def add_delta_flags(parser: argparse.ArgumentParser) -> None:
    """The held-fixed thresholds (repeatable, the first is the primary) and what they are
    calibrated on (`analysis.delta`)."""
    parser.add_argument(
        "--delta",
        dest="deltas",
        action="append",
        type=delta_options.fixed,
        metavar="D",
        help="a fixed delta_ref in [0, 1]",
    )
    parser.add_argument(
        "--delta-from",
        dest="deltas",
        action="append",
        type=delta_options.quantile,
        metavar="M:pQQ",
        help="the QQ-th percentile of method M's validation reference distribution, e.g. erm:p75",
    )
    parser.add_argument(
        "--delta-conformal",
        dest="deltas",
        action="append",
        type=delta_options.conformal,
        metavar="M:ALPHA",
        help="split-conformal delta_ref (Theorem B.3) on M's reference distribution, e.g. erm:0.1",
    )
    parser.add_argument(
        "--reference-distribution",
        choices=DISTRIBUTIONS,
        default="distances",
        help="what --delta-from/--delta-conformal calibrate on: the reference "
        "method's representation distances (default) or its score gaps",
    )


def options_from_args(args: argparse.Namespace) -> ReportOptions:
    """Validate the flags (one-line errors) and build the options."""
    settings = audit_settings(args)
    if args.n_boot < 0:
        raise UserError(f"--n-boot: must be >= 0, got {args.n_boot}")
    if not 0.0 < args.ci_level < 1.0:
        raise UserError(f"--ci-level: must be in (0, 1), got {args.ci_level}")
    sensitivity = parse_floats(args.sensitivity_deltas, "--sensitivity-deltas")
    for value in sensitivity:
        check_delta(value, "--sensitivity-deltas")
    return ReportOptions(
        deltas=args.deltas or [],
        distribution=args.reference_distribution,
        split=args.split,
        settings=settings,
        sensitivity=tuple(sensitivity),
        drift_baseline=args.drift_baseline,
        ci=CISettings(args.n_boot, args.ci_level),
        figures=not args.no_figures,
    )


def run_report(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    experiment = load(*args.experiments)
    report = write_report(experiment, args.out, options)
    note = running_note(experiment)
    if note:
        print(f"relif: note: {note}", file=sys.stderr)
    print(report)
    return 0
