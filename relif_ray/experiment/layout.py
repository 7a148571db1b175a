"""Where the files of an experiment directory lie, for every writer and reader of one (the
sweep, analysis, `relif export`); plain pyarrow.fs through `relif_ray.experiment.storage`, no
Ray.

    <experiment>/<EXPERIMENT_FILES>          the experiment's own files, where present
    <experiment>/<LOCK_FILE>                 held while a sweep writes the experiment
    <experiment>/<DRIVER_STATE_FILES>        Ray Tune's driver state, which --resume reads
    <experiment>/<trial folder>/<TRIAL_RECORDS>    Tune's records of the trial
    <experiment>/<trial folder>/checkpoint_<N>/    Tune's checkpoints; the final one holds
                                                   the trial's `outputs/`
                                                   (`relif_ray.experiment.outputs`)

This module is the one home of these names: a file that analysis reads at the experiment's
root is in `EXPERIMENT_FILES`, which `relif export` copies.
"""

from __future__ import annotations

import json
import re
from fnmatch import fnmatch
from pathlib import PurePosixPath
from typing import Any

import pyarrow.fs as pafs

from relif_ray.experiment import storage
from relif_ray.experiment.schema import OUTPUTS_DIR, TRIAL_FILE
from relif_ray.experiment.storage import Location

PARETO_FILE = "pareto.csv"
"""The Pareto set of every Optuna study of a `--search optuna` sweep on validation
(`relif_ray.sweep.selection.PARETO_COLUMNS`), written when the sweep ends; read by
`--select-from`."""
SELECTION_FILE = "selection.csv"
"""The (r*, eta) a `--select-from` sweep chose per label and seed from a search's
`PARETO_FILE`; analysis merges the chosen settings of a label into one row."""
SQUASH_CONSTANTS_FILE = "squash_constants.json"
"""seed -> task -> [q10, q90] of that seed's ERM reference run: the squash constants of
same-seed ReLiF training and of the audit (`relif_ray.reference`), written by the driver."""
EXPERIMENT_FILES = (PARETO_FILE, SELECTION_FILE, SQUASH_CONSTANTS_FILE)
"""The experiment-level files analysis reads, and `relif export` copies, where present."""
LOCK_FILE = ".relif-sweep.lock"
"""The lock a sweep driver holds on its experiment (`relif_ray.experiment.lock`); not
exported: a copy is never being written."""

EXPERIMENT_STATE_FILES = "experiment_state-*.json"
"""Tune's trial list, one per driver run (the run's start time in the name): an experiment
directory holds a sweep that `--resume` can continue exactly when it has one."""
SEARCHER_STATE_FILES = "searcher-state-*.pkl"
"""The snapshot of our own searcher, one per driver run (`relif_ray.tuning.order.
ReferenceOrder.save`): JSON, whatever the name Tune gives it says; never unpickled."""
DRIVER_STATE_FILES = (EXPERIMENT_STATE_FILES, "search_gen_state-*.json", SEARCHER_STATE_FILES)
"""Ray Tune's driver state in an experiment directory, one file per kind and driver run;
resume reads the newest of each kind. Besides our searcher's snapshot, they are Tune's own:
the trial list (JSON) and the search generator's state (a pickle, which Tune loads)."""

PARAMS_FILE = "params.json"
"""Tune's config of a trial: a trial folder without outputs is a trial once it has this."""
RESULT_FILE = "result.json"
"""Tune's per-iteration results of a trial (one JSON object per line; one iteration = one
epoch of `relif_ray.tuning.trainable.ReLiFTrainable`)."""
ERROR_FILE = "error.txt"
"""Tune's error of a failed trial (its last line is the exception)."""
TRIAL_RECORDS = (PARAMS_FILE, RESULT_FILE, ERROR_FILE)
_CHECKPOINT = re.compile(r"checkpoint_(\d+)$")


def trial_folders(root: Location) -> dict[Location, dict[str, int]]:
    """Trial folder -> the paths of its files relative to it, with their sizes, from one
    recursive listing (a few requests on object storage however many trials there are)."""
    folders: dict[str, dict[str, int]] = {}
    for relative, size in storage.list_files(root).items():
        folder, slash, rest = relative.partition("/")
        if slash:
            folders.setdefault(folder, {})[rest] = size
    return {storage.join(root, name): folders[name] for name in sorted(folders)}


def newest_driver_state(experiment: Location) -> list[str]:
    """The names of the newest file of each kind in `DRIVER_STATE_FILES` that the experiment
    directory holds (the files a resume reads); none for a directory that does not exist."""
    store, root = storage.filesystem(storage.location(experiment))
    infos = store.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    names = [PurePosixPath(info.path).name for info in infos if info.type == pafs.FileType.File]
    newest = []
    for pattern in DRIVER_STATE_FILES:
        newest += sorted(name for name in names if PurePosixPath(name).match(pattern))[-1:]
    return newest


def tune_trials(experiment: Location) -> dict[str, dict[str, Any]]:
    """trial id -> Tune config of every trial in the experiment's newest
    `EXPERIMENT_STATE_FILES` (Tune's trial list, which `--resume` continues: its "trial_data"
    holds each trial's state as a JSON text); none without one. `storage.DamagedFile` if the
    file is not such a list."""
    return {trial: dict(state["config"]) for trial, state in _tune_trial_states(experiment).items()}


def tune_statuses(experiment: Location) -> dict[str, str]:
    """trial id -> status in the experiment's newest trial list (PENDING, RUNNING, TERMINATED,
    ERROR, ...; as `tune_trials`)."""
    return {trial: str(state["status"]) for trial, state in _tune_trial_states(experiment).items()}


def running_statuses(experiment: Location) -> dict[str, str]:
    """`tune_statuses` of an experiment that a running sweep writes: Tune rewrites its trial
    list at each snapshot, so one caught cut off is read again (`storage.read_settled`); {}
    where it stays unreadable, or there is none yet."""
    try:
        return storage.read_settled(lambda: tune_statuses(experiment), rewritten=True)
    except storage.DamagedFile:
        return {}


def newest_trial_list(experiment: Location) -> Location | None:
    """The experiment's newest `EXPERIMENT_STATE_FILES` (Tune's trial list, which Tune writes
    when the sweep's first trial is created and `--resume` continues); None without one."""
    newest = [
        name for name in newest_driver_state(experiment) if fnmatch(name, EXPERIMENT_STATE_FILES)
    ]
    return storage.join(storage.location(experiment), newest[0]) if newest else None


def _tune_trial_states(experiment: Location) -> dict[str, dict[str, Any]]:
    """trial id -> Tune's state of the trial, from the newest trial list (see `tune_trials`)."""
    place = newest_trial_list(experiment)
    if place is None:
        return {}
    return trial_list_states(place, storage.read_json(place))


def trial_list_states(place: Location, state: Any) -> dict[str, dict[str, Any]]:
    """trial id -> Tune's state of the trial in a trial list read from `place` (its JSON
    document `state`), so that a reader that holds the file reads it no second time;
    `storage.DamagedFile` naming `place` if it is not such a list."""
    with storage.reading(place):
        trials = [json.loads(trial) for trial, _ in state["trial_data"]]
        return {str(trial["trial_id"]): trial for trial in trials}


def check_file(place: Location) -> None:
    """Read a file of an experiment as its name says it is (Tune's `RESULT_FILE`: JSON lines;
    .json, .csv; .parquet: its footer, where a cut-off file fails; anything else: UTF-8 text);
    `storage.DamagedFile` naming it if it is not (`relif export` checks what it copies)."""
    name = PurePosixPath(storage.display(place)).name
    if name == RESULT_FILE:
        storage.read_json_lines(place)
    elif name.endswith(".json"):
        storage.read_json(place)
    elif name.endswith(".csv"):
        storage.read_csv(place)
    elif name.endswith(".parquet"):
        storage.read_parquet(place, columns=[])
    else:
        storage.read_text(place)


def final_outputs(trial_dir: Location, files: dict[str, int]) -> Location | None:
    """The outputs folder of the trial's latest checkpoint that has one (None if none has);
    `files` as listed by `trial_folders`."""
    checkpoint = final_outputs_relative(files)
    return None if checkpoint is None else storage.join(trial_dir, *checkpoint.split("/"))


def final_outputs_relative(files: dict[str, int]) -> str | None:
    """`checkpoint_<N>/outputs` of the latest checkpoint with outputs, relative to the trial
    folder whose `files` are given (None if no checkpoint has outputs)."""
    candidates = []
    for relative in files:
        checkpoint, _, rest = relative.partition("/")
        match = _CHECKPOINT.match(checkpoint)
        if match and rest == f"{OUTPUTS_DIR}/{TRIAL_FILE}":
            candidates.append((int(match.group(1)), checkpoint))
    if not candidates:
        return None
    return f"{max(candidates)[1]}/{OUTPUTS_DIR}"


def outputs_sizes(files: dict[str, int], outputs: str) -> dict[str, int]:
    """The files of the outputs folder `outputs` (relative to the trial folder, as
    `final_outputs_relative` gives it) with their sizes, relative to that folder; `files` as
    listed by `trial_folders`."""
    prefix = f"{outputs}/"
    return {name[len(prefix) :]: size for name, size in files.items() if name.startswith(prefix)}
