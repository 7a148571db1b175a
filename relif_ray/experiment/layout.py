"""Where a trial's files lie in an experiment directory, for every reader of one (analysis,
`relif export`); plain pyarrow.fs through `relif_ray.experiment.storage`, no Ray.

A sweep writes one folder per trial into the experiment directory. Next to Ray Tune's
checkpoints (`checkpoint_<N>/`) a trial folder holds Tune's records of the trial
(`TRIAL_RECORDS`); the outputs of a finished trial (`relif_ray.experiment.outputs`) are in the
`outputs/` folder of its final checkpoint.
"""

from __future__ import annotations

import re

from relif_ray.experiment import storage
from relif_ray.experiment.outputs import OUTPUTS_DIR, TRIAL_FILE
from relif_ray.experiment.storage import Location

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
