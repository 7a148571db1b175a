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
is a new local folder, written under a temporary name and renamed when complete. Every file
copied is read back as what it is (`relif_ray.experiment.layout.check_file`): a damaged one
stops the export with one line naming it, and nothing is left behind, so a copy that exists
reads like its source. An experiment that a sweep is still writing is exported as far as its
trials have finished (`export_experiment`).
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
    check_file,
    final_outputs_relative,
    outputs_sizes,
    running_statuses,
    trial_folders,
)
from relif_ray.experiment.lock import running_sweep
from relif_ray.experiment.outputs import check_complete, read_trial_record, scheduler_snapshot


@dataclass(frozen=True)
class ExportSummary:
    """trials, finished: trial folders copied, and those of them with outputs; running: the
    trial folders of a running sweep left out (empty when no sweep runs); bytes copied, and
    of the experiment directory."""

    trials: int
    finished: int
    running: list[str]
    copied_bytes: int
    source_bytes: int


def export_experiment(experiment: str, destination: str | Path) -> ExportSummary:
    """Copy what analysis needs of `experiment` to the new local folder `destination`.

    While a sweep still writes the experiment (it holds the lock: `running_sweep`), only its
    finished trials are copied, those whose outputs are all there (`check_complete`) and final
    (`_unfinished`); the others are left out and named in the summary. Ray Tune's records,
    which the running sweep rewrites at each snapshot, are read again where one is caught cut
    off (`storage.read_settled`), so no copied file is ever a partial one."""
    root = storage.location(experiment, "EXP")
    if storage.file_type(root) != pafs.FileType.Directory:
        raise UserError(f"experiment directory not found: {storage.display(root)}")
    target = storage.check_writable(destination, "DEST")
    if target is None:
        shown = storage.redacted(str(destination))
        raise UserError(f"DEST {shown}: export writes a new local folder, not a URI")
    if target.exists():
        raise UserError(f"DEST {destination}: already exists (export writes a new folder)")
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    running = running_sweep(root) is not None
    statuses = running_statuses(root) if running else None
    trials = finished = 0
    left_out: list[str] = []
    staging.mkdir(parents=True)
    try:
        for trial_dir, files in trial_folders(root).items():
            outputs = final_outputs_relative(files)
            copied = [name for name in TRIAL_RECORDS if name in files]
            if not copied and outputs is None:
                continue  # not a trial folder
            folder = Path(storage.display(trial_dir)).name
            unfinished = _unfinished(trial_dir, files, outputs, statuses)
            if running and (outputs is None or unfinished):
                left_out.append(folder)
                continue
            if unfinished:
                raise UserError(f"{unfinished}; nothing was exported")
            if outputs is not None:
                finished += 1
                copied += sorted(name for name in files if name.startswith(f"{outputs}/"))
            trials += 1
            for name in copied:
                _copy(storage.join(trial_dir, *name.split("/")), staging / folder / name, running)
        if trials == 0 and not left_out:
            raise UserError(f"no trials found in {storage.display(root)}")
        for name in EXPERIMENT_FILES:
            if storage.file_type(storage.join(root, name)) == pafs.FileType.File:
                _copy(storage.join(root, name), staging / name, running)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    copied_bytes = _size(storage.location(target))
    return ExportSummary(trials, finished, left_out, copied_bytes, _size(root))


def _unfinished(
    trial_dir: storage.Location,
    files: dict[str, int],
    outputs: str | None,
    statuses: dict[str, str] | None,
) -> str | None:
    """Why the outputs folder `outputs` of a trial is not its finished trial's (None where it
    is, or where the trial has none): its trial.json damaged, or a file it lists missing or of
    another size (`check_complete`); while a sweep runs (`statuses`: Tune's trial statuses),
    also a snapshot that a scheduler's rung made of a trial running on (`scheduler_snapshot`).
    A running sweep's trial is still running then; elsewhere it stops the export."""
    if outputs is None:
        return None
    place = storage.join(trial_dir, *outputs.split("/"))
    try:
        record = read_trial_record(place)
        check_complete(place, record, outputs_sizes(files, outputs))
    except storage.DamagedFile as damaged:
        return str(damaged)
    except FileNotFoundError:  # deleted by the running sweep since it was listed
        return f"{storage.display(place)}: deleted while read"
    if statuses is not None and scheduler_snapshot(record, statuses):
        return f"{storage.display(place)}: a scheduler's snapshot of a running trial"
    return None


def _copy(source: storage.Location, dest: Path, running: bool) -> None:
    """Copy one file, read back as what it is (`check_file`; again while a running sweep may be
    rewriting it): a damaged file is a one-line error naming the source, and the export stops
    (its staging folder is removed)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    store, path = storage.filesystem(source)

    def copy() -> None:
        with store.open_input_stream(path) as stream, dest.open("wb") as out:
            shutil.copyfileobj(stream, out)
        check_file(dest)

    try:
        storage.read_settled(copy, running)
    except storage.DamagedFile as damaged:
        raise UserError(
            f"{storage.DamagedFile(source, damaged.reason)}; nothing was exported"
        ) from None


def _size(root: storage.Location) -> int:
    store, path = storage.filesystem(root)
    selector = pafs.FileSelector(path, recursive=True)
    return sum(info.size or 0 for info in store.get_file_info(selector) if info.is_file)
