"""Copy only what analysis reads of an experiment, so a result travels light (`relif export`).

An experiment directory holds every trial's last `--keep-checkpoints` checkpoints, and each
checkpoint's `state.pt` (model, optimiser, method and controller state) is by far the largest
file: hundreds of MB for a ResNet-50, against a few MB of outputs per trial. Analysis
(`analysis.load`, `relif report`) reads none of it. The copy keeps the experiment's layout, so
everything that reads an experiment directory reads the copy unchanged:

    DEST/<trial folder>/checkpoint_N/outputs/   the trial's outputs
                                               (`relif_ray.experiment.outputs`), from its
                                               latest checkpoint that has them
    DEST/<trial folder>/<TRIAL_RECORDS>         Tune's records, where present
    DEST/<EXPERIMENT_FILES>                     where present

(`relif_ray.experiment.layout` says where these lie.) The source may be a local path or a
storage URI (file://, s3://, gs://: read through `relif_ray.experiment.storage`); DEST
is a new local folder, written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from relif_ray.errors import UserError
from relif_ray.experiment import storage
from relif_ray.experiment.layout import (
    EXPERIMENT_FILES,
    TRIAL_RECORDS,
    final_outputs_relative,
    trial_folders,
)


@dataclass(frozen=True)
class ExportSummary:
    trials: int
    finished: int
    copied_bytes: int
    source_bytes: int


def export_experiment(experiment: str, destination: str | Path) -> ExportSummary:
    """Copy what analysis needs of `experiment` to the new local folder `destination`."""
    root = storage.location(experiment)
    if storage.file_type(root) != pafs.FileType.Directory:
        raise UserError(f"experiment directory not found: {storage.display(root)}")
    target = Path(destination).resolve()
    if target.exists():
        raise UserError(f"DEST {destination}: already exists (export writes a new folder)")
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    trials = finished = 0
    staging.mkdir(parents=True)
    try:
        for trial_dir, files in trial_folders(root).items():
            outputs = final_outputs_relative(files)
            copied = [name for name in TRIAL_RECORDS if name in files]
            if outputs is not None:
                finished += 1
                copied += sorted(name for name in files if name.startswith(f"{outputs}/"))
            if not copied:
                continue  # not a trial folder
            trials += 1
            folder = staging / Path(storage.display(trial_dir)).name
            for name in copied:
                _copy(storage.join(trial_dir, *name.split("/")), folder / name)
        if trials == 0:
            raise UserError(f"no trials found in {storage.display(root)}")
        for name in EXPERIMENT_FILES:
            if storage.file_type(storage.join(root, name)) == pafs.FileType.File:
                _copy(storage.join(root, name), staging / name)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExportSummary(trials, finished, _size(storage.location(target)), _size(root))


def _copy(source: storage.Location, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    store, path = storage.filesystem(source)
    with store.open_input_stream(path) as stream, dest.open("wb") as out:
        shutil.copyfileobj(stream, out)


def _size(root: storage.Location) -> int:
    store, path = storage.filesystem(root)
    selector = pafs.FileSelector(path, recursive=True)
    return sum(info.size or 0 for info in store.get_file_info(selector) if info.is_file)
