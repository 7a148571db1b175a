"""`relif report EXP [EXP ...] --out DIR`: the command line of `analysis.write_report` (the
paper's tables and figures for experiment directories, and `report.md`)."""

from __future__ import annotations

import argparse
import sys
import warnings

from relif_ray.analysis import delta as delta_options
from relif_ray.analysis.delta import DISTRIBUTIONS
from relif_ray.analysis.experiment import SkippedFile, load
from relif_ray.analysis.groups import GroupOptions, MissingAttributes
from relif_ray.analysis.mtl_metrics import DeltaMOptions, read_metric_vector
from relif_ray.analysis.provenance import running_note
from relif_ray.analysis.report import ReportOptions, write_report
from relif_ray.analysis.results import SENSITIVITY_DELTAS, SPLITS
from relif_ray.analysis.tables import CISettings
from relif_ray.analysis.verdicts import VerdictSettings
from relif_ray.audit import check_delta
from relif_ray.cli.parsing import add_audit_flags, audit_settings, parse_floats
from relif_ray.errors import UserError

SHOW_WARNING = warnings.showwarning
"""Python's own way to show a warning."""


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
    add_interval_flags(parser)
    add_delta_m_flags(parser)
    parser.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
    add_group_flags(parser)
    parser.set_defaults(handler=run_report)


def add_group_flags(parser: argparse.ArgumentParser) -> None:
    """The group audit of clinical experiments (`relif_ray.analysis.groups.GroupOptions`)."""
    groups = GroupOptions()
    parser.add_argument(
        "--attributes",
        metavar="DIR",
        help="folder with the stays' sensitive attributes: MIMIC-III's benchmark root/ "
        "folder (needed for its group audit); eICU: a folder with all_data.csv (default: "
        "the trials' data folder)",
    )
    parser.add_argument(
        "--group-threshold",
        type=float,
        default=groups.threshold,
        help=f"probability at which a binary task predicts positive ({groups.threshold:g})",
    )
    parser.add_argument(
        "--long-stay-hours",
        type=float,
        default=groups.long_stay_hours,
        help="remaining stay (hours, a length-of-stay bin edge) from which a stay is long "
        f"({groups.long_stay_hours:g})",
    )
    parser.add_argument(
        "--age-bands",
        default=",".join(f"{age:g}" for age in groups.age_bands),
        help="inner edges of the age bands in years (comma-separated; "
        f"{','.join(f'{age:g}' for age in groups.age_bands)})",
    )
    parser.add_argument(
        "--min-group-size",
        type=int,
        default=groups.min_group_size,
        help="groups with fewer stays are flagged and left out of the disparities "
        f"({groups.min_group_size})",
    )


def add_delta_flags(parser: argparse.ArgumentParser) -> None:
    """The held-fixed thresholds (repeatable, the first is the primary) and what they are
    calibrated on (`relif_ray.analysis.delta`)."""
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


def add_interval_flags(parser: argparse.ArgumentParser) -> None:
    """The bootstrap replicates, the level of every interval and test, the equivalence margin
    of the verdicts over seeds (`relif_ray.analysis.verdicts.VerdictSettings`) and the
    adjustment over their family (`relif_ray.analysis.family`)."""
    ci = CISettings()
    parser.add_argument(
        "--n-boot",
        type=int,
        default=ci.n_boot,
        help="bootstrap replicates of the Bias intervals over the audit's pairs, the "
        "hierarchical bootstrap over seeds and the front shares (0: none; "
        f"{ci.n_boot})",
    )
    parser.add_argument(
        "--ci-level",
        type=float,
        default=ci.level,
        help=f"level of every interval and test of the report ({ci.level:g})",
    )
    verdicts = VerdictSettings()
    parser.add_argument(
        "--equivalence-margin",
        type=float,
        default=verdicts.margin,
        metavar="M",
        help="margin of the equivalence test of Worst and Macro against same-seed ERM, on the "
        f"normalized scores ({verdicts.margin:g})",
    )
    parser.add_argument(
        "--adjust",
        default="holm",
        metavar="holm|fdr_bh|none",
        help="adjustment of the p-values of the report's family of verdicts (its summary's "
        "and its group audit's): holm, the family-wise error (default); fdr_bh, "
        "Benjamini-Hochberg's false discovery rate, for screening many; none",
    )
    parser.add_argument(
        "--ratio-floor",
        type=float,
        default=verdicts.ratio_floor,
        metavar="R",
        help="where a per-seed Bias or VR ratio of 0 (the method's value is 0) counts on the "
        "log scale of the verdicts over seeds, unless a positive ratio of the comparison is "
        f"lower ({verdicts.ratio_floor:g})",
    )


def add_delta_m_flags(parser: argparse.ArgumentParser) -> None:
    """How Delta-M% is computed (`relif_ray.analysis.mtl_metrics.DeltaMOptions`; the defaults are
    LibMTL's against same-seed ERM)."""
    defaults = DeltaMOptions()
    parser.add_argument(
        "--delta-m-base",
        default=defaults.base,
        metavar="erm|FILE",
        help="Delta-M%% base: the same-seed ERM trial (erm, default) or a JSON file of fixed "
        'metric values, e.g. single-task numbers {"seg_miou": 0.383, ...}',
    )
    parser.add_argument(
        "--delta-m-sign",
        choices=("higher", "lower"),
        default=defaults.sign,
        help="higher: positive is better (LibMTL, default); lower: lower is better "
        "(Nash-MTL, FAMO)",
    )
    parser.add_argument(
        "--delta-m-average",
        choices=("task", "metric"),
        default=defaults.average,
        help="task: per task, then over tasks (LibMTL, default); metric: over all metrics "
        "(Nash-MTL, FAMO)",
    )
    parser.add_argument(
        "--delta-m-epochs",
        default=defaults.epochs,
        metavar="final|best|last:K",
        help="the values of each trial: its final checkpoint (default), its epoch with the "
        "best validation Macro, or the mean of its last K epochs (the test split's need "
        "train.epoch_test_metrics: true)",
    )


def delta_m_options(args: argparse.Namespace) -> DeltaMOptions:
    """`--delta-m-*` as options; a malformed `--delta-m-epochs` is a one-line UserError."""
    rule, _, count = args.delta_m_epochs.partition(":")
    if rule not in ("final", "best", "last") or bool(count) != (rule == "last"):
        raise UserError(f"--delta-m-epochs: final, best or last:K, got {args.delta_m_epochs!r}")
    if count and (not count.isdigit() or int(count) < 1):
        raise UserError(f"--delta-m-epochs: K must be a positive integer, got {count!r}")
    if args.delta_m_base != "erm":
        read_metric_vector(args.delta_m_base)  # a bad file fails before the experiment loads
    last_k = int(count) if count else DeltaMOptions.last_k
    return DeltaMOptions(args.delta_m_base, args.delta_m_sign, args.delta_m_average, rule, last_k)


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
        verdicts=VerdictSettings(
            level=args.ci_level,
            margin=args.equivalence_margin,
            n_boot=args.n_boot,
            ratio_floor=args.ratio_floor,
        ),
        delta_m=delta_m_options(args),
        figures=not args.no_figures,
        groups=GroupOptions(
            attributes=args.attributes,
            threshold=args.group_threshold,
            long_stay_hours=args.long_stay_hours,
            age_bands=tuple(parse_floats(args.age_bands, "--age-bands")),
            min_group_size=args.min_group_size,
        ),
        adjust=args.adjust,
    )


def run_report(args: argparse.Namespace) -> int:
    """Write the report; each damaged file it left out is one warning line on stderr
    (`relif_ray.analysis.experiment.SkippedFile`), also when the report then fails."""
    options = options_from_args(args)
    with warnings.catch_warnings():
        warnings.simplefilter("always", SkippedFile)
        warnings.simplefilter("always", MissingAttributes)
        warnings.showwarning = show_skipped
        experiment = load(*args.experiments)
        report = write_report(experiment, args.out, options)
    note = running_note(experiment)
    if note:
        print(f"relif: note: {note}", file=sys.stderr)
    print(report)
    return 0


def show_skipped(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    """`warnings.showwarning` of `relif report`: a skipped file is the one line
    `relif: warning: <what was skipped>: <file>: damaged file (<why>)`, stays without
    attributes `relif: warning: <how many> stays ... have no attribute row in <folder>: ...`."""
    if issubclass(category, (SkippedFile, MissingAttributes)):
        print(f"relif: warning: {message}", file=sys.stderr)
    else:
        SHOW_WARNING(message, category, filename, lineno, file, line)
