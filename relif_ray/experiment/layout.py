"""Where the files of an experiment directory lie, for every writer and reader of one (the
sweep, analysis, `relif export`); plain pyarrow.fs through `relif_ray.experiment.storage`, no
Ray.

    <experiment>/<EXPERIMENT_FILES>          the experiment's own files, where present
    <experiment>/<LOCK_FILE>                 held while a sweep writes the experiment
    <experiment>/<trial folder>/<TRIAL_RECORDS>    Tune's records of the trial
    <experiment>/<trial folder>/checkpoint_<N>/    Tune's checkpoints; the final one holds
                                                   the trial's `outputs/`
                                                   (`relif_ray.experiment.outputs`)

This module is the one home of these names: a file that analysis reads at the experiment's
root is in `EXPERIMENT_FILES`, which `relif export` copies.
"""

from __future__ import annotations

import re

from relif_ray.experiment import storage
from relif_ray.experiment.outputs import OUTPUTS_DIR, TRIAL_FILE
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

PARAMS_FILE = "params.json"
"""Tune's config of a trial: a trial folder without outputs is a trial once it has this."""
RESULT_FILE = "result.json"
"""Tune's per-iteration results of a trial (one JSON object per line; one iteration = one
epoch of `relif_ray.tuning.trainable.ReLiFTrainable`)."""
ERROR_FILE = "error.txt"
"""Tune's error of a failed trial (its last line is the exception)."""
TRIAL_RECORDS = (PARAMS_FILE, RESULT_FILE, ERROR_FILE)
_CHECKPOINT = re.compile(r"checkpoint_(\d+)$")


def trial_folders(root: Location) -> dict[Location, set[str]]:
    """Trial folder -> the paths of its files relative to it, from one recursive listing (a
    few requests on object storage however many trials there are)."""
    folders: dict[str, set[str]] = {}
    for relative in storage.list_files(root):
        folder, slash, rest = relative.partition("/")
        if slash:
            folders.setdefault(folder, set()).add(rest)
    return {storage.join(root, name): folders[name] for name in sorted(folders)}


def final_outputs(trial_dir: Location, files: set[str]) -> Location | None:
    """The outputs folder of the trial's latest checkpoint that has one (None if none has);
    `files` as listed by `trial_folders`."""
    checkpoint = final_outputs_relative(files)
    return None if checkpoint is None else storage.join(trial_dir, *checkpoint.split("/"))


def final_outputs_relative(files: set[str]) -> str | None:
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
