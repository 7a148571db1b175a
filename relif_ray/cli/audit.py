"""`relif audit SCORES --delta D`: the fixed-delta audit of one score file (Algorithm 1).

SCORES is a parquet or CSV file (a local path or a `file://`, `s3://` or `gs://` URI, see
`relif_ray.experiment.storage`) with columns `task` and `score` (in [0, 1]) and optionally
`example_id`, `valid` and `split`. A file with several splits needs `--split NAME`.
Output: a small table, or with `--json` one JSON object {"bias", "vr", "pairs": {"a|b":
{"bias", "vr", "n"}}}. Bad input raises `UserError` (one line; the `relif` entry point prints
`relif: error: <message>` and exits with status 2).
"""

from __future__ import annotations

import argparse
import json
from pathlib import PurePosixPath
from urllib.parse import urlsplit

import pandas as pd
from pyarrow.fs import FileType

from relif_ray.audit import (
    AuditResult,
    AuditSettings,
    check_delta,
    fixed_delta_audit,
    validate_scores,
)
from relif_ray.cli.parsing import add_audit_flags, audit_settings
from relif_ray.errors import UserError, first_line
from relif_ray.experiment import storage


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `audit` subcommand."""
    parser = subparsers.add_parser(
        "audit",
        help="fixed-delta Bias/VR audit of a score file",
        description="Bias and VR of cross-task audit-score gaps under one fixed threshold "
        "(the paper's Algorithm 1).",
    )
    parser.add_argument(
        "scores",
        metavar="SCORES",
        help="parquet or CSV file (path or file://, s3://, gs:// URI): task, score, ...",
    )
    parser.add_argument("--delta", type=float, required=True, help="fixed threshold in [0, 1]")
    add_audit_flags(parser)
    parser.add_argument("--split", help="audit only the rows of this split")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run_audit)


def read_scores(path: str) -> pd.DataFrame:
    """Read a parquet or CSV score file (a local path or a `file://`, `s3://`, `gs://` URI,
    see `relif_ray.experiment.storage`); any failure is a one-line `UserError`, naming the
    file without the credentials of its URI."""
    place, shown = storage.location(path), storage.redacted(path)
    suffix = PurePosixPath(urlsplit(path).path if isinstance(place, str) else path).suffix
    if suffix.lower() not in (".parquet", ".csv"):
        raise UserError(f"{shown}: expected a .parquet or .csv file")
    if storage.file_type(place) != FileType.File:
        raise UserError(f"{shown}: no such file")
    try:  # a file that is not what its name says: `storage.DamagedFile`, naming it
        if suffix.lower() == ".parquet":
            return storage.read_parquet(place).to_pandas()
        return storage.read_csv(place)
    except OSError as error:
        raise UserError(f"{shown}: cannot read: {first_line(error)}") from error


def select_split(scores: pd.DataFrame, split: str | None, path: str) -> pd.DataFrame:
    if split is None:
        return scores
    if "split" not in scores.columns:
        raise UserError(f"{path}: --split given but the file has no 'split' column")
    chosen = scores[scores["split"].astype(str) == split]
    if chosen.empty:
        raise UserError(f"{path}: no rows with split {split!r}")
    return chosen


def run_audit(args: argparse.Namespace) -> int:
    check_delta(args.delta, "--delta")
    settings = audit_settings(args)
    source = storage.redacted(args.scores)
    scores = select_split(read_scores(args.scores), args.split, source)
    validate_scores(scores, source=source)
    result = fixed_delta_audit(scores, args.delta, settings=settings)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(format_table(result, args.delta, settings, source))
    return 0


def format_table(result: AuditResult, delta: float, settings: AuditSettings, source: str) -> str:
    """The audit as a table; `source`: the score file as shown."""
    lines = [
        f"fixed-delta audit of {source}: delta={delta:g}, pool_size={settings.pool_size}, "
        f"pairs={settings.pairs}, pair_seed={settings.pair_seed}, eval_seed={settings.eval_seed}",
    ]
    width = max(len("task pair"), *(len(key) for key in result.pairs))
    lines.append(f"{'task pair':<{width}}  {'bias':>8}  {'vr':>8}  {'n':>7}")
    for key, pair in result.pairs.items():
        lines.append(f"{key:<{width}}  {pair.bias:8.4f}  {pair.vr:8.4f}  {pair.n:7d}")
    lines.append(f"{'mean':<{width}}  {result.bias:8.4f}  {result.vr:8.4f}")
    return "\n".join(lines)
