"""`relif export EXP DEST`: copy only what analysis reads, so a result travels light.

An experiment directory holds every trial's last `--keep-checkpoints` checkpoints, and each
checkpoint's `state.pt` (model, optimiser, method and controller state) is by far the largest
file: hundreds of MB for a ResNet-50, against a few MB of outputs per trial. Analysis
(`analysis.load`, `relif report`) reads none of it. The copy keeps the experiment's layout, so
everything that reads an experiment directory reads the copy unchanged:

    DEST/<trial folder>/checkpoint_N/outputs/   the trial's outputs (`relif_ray.outputs`),
                                               from its latest checkpoint that has them
    DEST/<trial folder>/<TRIAL_FILES>           where present
    DEST/<EXPERIMENT_FILES>                     where present

The source may be a local path or a storage URI (s3://, gs://: read through pyarrow.fs); DEST
is a new local folder, written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import argparse
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from relif_ray.errors import UserError
from relif_ray.outputs import OUTPUTS_DIR, TRIAL_FILE

EXPERIMENT_FILES = ("pareto.csv",)
"""Experiment-level files analysis reads: the Optuna Pareto sets."""
TRIAL_FILES = ("params.json", "result.json", "error.txt")
"""Per-trial files next to the checkpoints: the trial's Tune config, its per-epoch results and
the error of a failed trial (analysis lists trials without outputs from these)."""

_CHECKPOINT = re.compile(r"checkpoint_(\d+)$")


@dataclass(frozen=True)
class ExportSummary:
    trials: int
    finished: int
    copied_bytes: int
    source_bytes: int


def experiment_filesystem(experiment: str) -> tuple[pafs.FileSystem, str]:
    """(file system, path inside it) of a local experiment path or a storage URI."""
    if "://" not in experiment:
        return pafs.LocalFileSystem(), str(Path(experiment).resolve())
    try:
        return pafs.FileSystem.from_uri(experiment)
    except (ValueError, OSError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise UserError(f"EXP {experiment}: cannot open ({exc})") from None


def final_outputs(filesystem: pafs.FileSystem, trial_dir: str) -> str | None:
    """The outputs folder of the trial's latest checkpoint that has one (None if none has)."""
    checkpoints = [
        (int(match.group(1)), info.path)
        for info in filesystem.get_file_info(pafs.FileSelector(trial_dir))
        if info.type == pafs.FileType.Directory
        and (match := _CHECKPOINT.match(info.base_name)) is not None
    ]
    for _, checkpoint in sorted(checkpoints, reverse=True):
        outputs = f"{checkpoint}/{OUTPUTS_DIR}"
        if filesystem.get_file_info(f"{outputs}/{TRIAL_FILE}").type == pafs.FileType.File:
            return outputs
    return None


def export_experiment(experiment: str, destination: str | Path) -> ExportSummary:
    """Copy what analysis needs of `experiment` to the new local folder `destination`."""
    filesystem, root = experiment_filesystem(experiment)
    if filesystem.get_file_info(root).type != pafs.FileType.Directory:
        raise UserError(f"experiment directory not found: {experiment}")
    target = Path(destination).resolve()
    if target.exists():
        raise UserError(f"DEST {destination}: already exists (export writes a new folder)")
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    local = pafs.LocalFileSystem()
    trials = finished = 0
    staging.mkdir(parents=True)
    try:
        for info in filesystem.get_file_info(pafs.FileSelector(root)):
            if info.type != pafs.FileType.Directory:
                continue
            copied = [
                f"{info.path}/{name}"
                for name in TRIAL_FILES
                if filesystem.get_file_info(f"{info.path}/{name}").type == pafs.FileType.File
            ]
            outputs = final_outputs(filesystem, info.path)
            if outputs is None and not copied:
                continue  # not a trial folder
            trials += 1
            folder = staging / info.base_name
            folder.mkdir(parents=True)
            for path in copied:
                _copy(filesystem, path, local, str(folder / Path(path).name))
            if outputs is not None:
                finished += 1
                relative = outputs[len(info.path) + 1 :]
                (folder / relative).mkdir(parents=True)
                _copy(filesystem, outputs, local, str(folder / relative))
        if trials == 0:
            raise UserError(f"no trials found in {experiment}")
        for name in EXPERIMENT_FILES:
            path = f"{root}/{name}"
            if filesystem.get_file_info(path).type == pafs.FileType.File:
                _copy(filesystem, path, local, str(staging / name))
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExportSummary(trials, finished, _size(local, str(target)), _size(filesystem, root))


def _copy(source: pafs.FileSystem, path: str, local: pafs.FileSystem, dest: str) -> None:
    """Copy a file, or a folder's contents into the existing folder `dest`."""
    pafs.copy_files(path, dest, source_filesystem=source, destination_filesystem=local)


def _size(filesystem: pafs.FileSystem, root: str) -> int:
    selector = pafs.FileSelector(root, recursive=True)
    return sum(info.size or 0 for info in filesystem.get_file_info(selector) if info.is_file)


def _megabytes(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


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
    summary = export_experiment(args.experiment, args.destination)
    unfinished = summary.trials - summary.finished
    print(
        f"exported {summary.trials} trial(s) ({summary.finished} with outputs"
        + (f", {unfinished} without" if unfinished else "")
        + f"): {_megabytes(summary.copied_bytes)} of {_megabytes(summary.source_bytes)} "
        f"to {Path(args.destination).resolve()}"
    )
    return 0
