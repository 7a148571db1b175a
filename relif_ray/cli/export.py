"""`relif export EXP DEST`: copy what analysis reads of an experiment to a new local folder
(`relif_ray.experiment.export`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from relif_ray.experiment.export import export_experiment
from relif_ray.experiment.lock import still_running


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `relif export`."""
    parser = subparsers.add_parser(
        "export",
        help="copy what analysis needs of an experiment (no checkpoint states)",
        description="Copy an experiment's trial outputs, per-trial Tune records and experiment "
        "files (not the checkpoints' model/optimiser states) to a new local folder that "
        "`relif report` and `analysis.load` read like the original.",
    )
    parser.add_argument("experiment", metavar="EXP", help="experiment directory (path or URI)")
    parser.add_argument("destination", metavar="DEST", help="new local folder")
    parser.set_defaults(handler=run_export)


def run_export(args: argparse.Namespace) -> int:
    """Export; the running trials a running sweep's export left out are one note line."""
    summary = export_experiment(args.experiment, args.destination)
    if summary.running:
        note = still_running(summary.running)
        print(f"relif: note: A sweep is still running: {note}, not exported", file=sys.stderr)
    unfinished = summary.trials - summary.finished
    print(
        f"exported {summary.trials} trial(s) ({summary.finished} with outputs"
        + (f", {unfinished} without" if unfinished else "")
        + f"): {_megabytes(summary.copied_bytes)} of {_megabytes(summary.source_bytes)} "
        f"to {Path(args.destination).resolve()}"
    )
    return 0


def _megabytes(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"
