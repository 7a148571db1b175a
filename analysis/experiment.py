"""Read experiment directories offline (no Ray, no re-training) into pandas DataFrames.

An experiment directory is what a sweep leaves in storage: one folder per trial, each with
Ray Tune's checkpoints; the final checkpoint holds `outputs/` (see
`relif_ray.experiment.outputs`; where each file lies: `relif_ray.experiment.layout`). Trials
that errored (Tune's `error.txt`), never finished, or are still running (a sweep holds the
experiment's lock: `relif_ray.experiment.lock`) are listed, never silently dropped.

Loading reads each trial's `trial.json` and `scores.parquet` (one arrow conversion for all
trials: 1,000 trials load in about a second); per-step traces and representations are read
only when asked for. Each seed of a Tune trial that trained several is a trial row of its own
(`relif_ray.experiment.record`), in the frames and in Tune's per-epoch records alike.
"""

from __future__ import annotations

import warnings
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
from pyarrow.fs import FileType

from relif_ray.config import HARD_SHARING, ReLiFConfig
from relif_ray.errors import UserError, last_line
from relif_ray.experiment import storage
from relif_ray.experiment.layout import (
    ERROR_FILE,
    PARAMS_FILE,
    RESULT_FILE,
    final_outputs,
    final_outputs_relative,
    outputs_sizes,
    running_statuses,
    trial_folders,
)
from relif_ray.experiment.lock import running_sweep
from relif_ray.experiment.outputs import (
    check_complete,
    read_outcomes,
    read_representations,
    read_trial_record,
    scheduler_snapshot,
    seed_records,
)
from relif_ray.experiment.record import (
    COMPLETED,
    TRAINING_ITERATION,
    FusedTrialRecord,
    TrialRecord,
    seed_part,
    split_metric,
)
from relif_ray.experiment.schema import SCORES_FILE, TRACE_FILE, TRIAL_FILE
from relif_ray.experiment.storage import DamagedFile, Location
from relif_ray.problems import use_spec
from relif_ray.progress import progress
from relif_ray.sweep.labels import SETTING_FIELDS, setting_values, variant_name
from relif_ray.sweep.selection import SELECTION_FILE

SCORE_COLUMNS = ["trial", "split", "task", "example_id", "score", "valid"]


class Experiment:
    """All finished trials of one or more experiment directories, and the unfinished ones.

    trials: one row per finished trial: trial, label (method label, e.g. "relif"), variant (the
        label, plus its identifying settings, e.g. " (r*=.., eta=..)" or " (lambda0=..)", where one
        label was run at several settings, and " [architecture]" where the trials ran on
        several: `variant_names`), method, relif, seed, dataset, architecture, r_star,
        eta, lambda0 (each NaN where it does not identify the trial's setting,
        `relif_ray.sweep.labels.setting_values`), steps, status ("completed", or "stopped": stopped
        early by the Tune scheduler, outputs at that epoch), experiment, path, config (dict), then
        every metric as <split>_<metric> (e.g. val_worst).
    scores: trial, split, task, example_id, score (raw audit score as stored), valid.
    epochs: per-epoch results Tune recorded (trial, epoch, val_<metric>, val_bias, ...; read
        on first access).
    traces: trial, step, loss_<task>, weight_<task>, and ReLiF's lambda, r, r_ema, tau, kappa,
        loss_lip where enabled (read on first access).
    problems: trial folders without outputs: path, status ("errored", "running" while a sweep
        still writes the experiment, "incomplete", or "damaged": its trial.json or scores
        cannot be read, and a `SkippedFile` warning says which), error.
    outcomes(trial, split): a clinical trial's labels and predictions per stay (read when
        asked for; the group audit, `relif_ray.analysis.groups`).
    outputs: trial id -> its outputs folder (a `Path`, or a URI in object storage).
    paths: the experiment directories as loaded.
    fused: trial id -> (its Tune trial folder, its seed) of each seed of a Tune trial that
        trained several (`relif_ray.experiment.record.SEEDS`): its own row everywhere.
    """

    def __init__(
        self,
        trials: pd.DataFrame,
        scores: pd.DataFrame,
        problems: pd.DataFrame,
        outputs: dict[str, Location],
        paths: list[Location],
        fused: dict[str, tuple[Location, int]] | None = None,
    ) -> None:
        self.trials = trials
        self.scores = scores
        self.problems = problems
        self.outputs = outputs
        self.paths = paths
        self.fused = fused or {}

    @cached_property
    def traces(self) -> pd.DataFrame:
        """Every trial's per-step trace; a damaged one is left out (said with `SkippedFile`)."""
        trials, tables = [], []
        for trial, outputs in self.outputs.items():
            try:
                tables.append(storage.read_parquet(storage.join(outputs, TRACE_FILE)))
            except DamagedFile as damaged:
                skip(f"the trace of trial {trial}", damaged)
                continue
            trials.append(trial)
        return _stacked_frame(tables, trials, ["trial", "step"])

    @cached_property
    def epochs(self) -> pd.DataFrame:
        """Per-epoch results as Tune recorded them (each trial folder's `result.json`): trial,
        epoch, and every numeric value the trial reported (val_<metric>, worst, macro,
        val_bias / val_vr of the live audit, train_step, time_total_s, ...). After a resume
        an epoch may be recorded twice; the last record is kept. Epochs without a record
        are said with `SkippedFile` (`_warn_missing_epochs`). Read on first access."""
        frames = []
        for trial, outputs in self.outputs.items():
            one_seed = (storage.parent(storage.parent(outputs)), None)
            trial_dir, seed = self.fused.get(trial, one_seed)
            records = _result_records(trial_dir)
            if seed is not None:  # one seed of a trial that trained several
                records = [seed_part(record, seed) for record in records]
            if records:
                frame = pd.DataFrame.from_records(records).select_dtypes(["number", "bool"])
                frame = frame.drop_duplicates(TRAINING_ITERATION, keep="last")
                _warn_missing_epochs(frame[TRAINING_ITERATION], trial_dir)
                frame.insert(0, "trial", trial)
                frames.append(frame)
        if not frames:
            return pd.DataFrame(columns=["trial", "epoch"])
        epochs = pd.concat(frames, ignore_index=True)
        if "epoch" not in epochs.columns:
            epochs["epoch"] = epochs[TRAINING_ITERATION]
        leading = ["trial", "epoch"]
        return epochs[leading + [c for c in epochs.columns if c not in leading]]

    def trace(self, trial: str) -> pd.DataFrame:
        """The per-step trace of one trial (column `trial` first)."""
        table = storage.read_parquet(storage.join(self.outputs[trial], TRACE_FILE)).to_pandas()
        table.insert(0, "trial", trial)
        return table

    def representations(self, trial: str, split: str = "val") -> tuple[np.ndarray, np.ndarray]:
        """(example_ids, (N, D) shared representations) of one trial and split."""
        return read_representations(self.outputs[trial], split)

    def outcomes(self, trial: str, split: str) -> pd.DataFrame | None:
        """One trial's outcomes on `split` (task, example_id, position, label, prediction and
        the example's name; `relif_ray.experiment.outputs.read_outcomes`), or None where its
        tasks store none (NYUv2)."""
        return read_outcomes(self.outputs[trial], split)


def load(*paths: str | Path) -> Experiment:
    """Load one or more experiment directories (their trials are concatenated in the given
    order): local paths, `file://`, `s3://` or `gs://` URIs (see `relif_ray.experiment.storage` for
    credentials and endpoints). A missing directory or one without any trial folder is a
    one-line UserError."""
    if not paths:
        raise UserError("analysis.load: no experiment directory given")
    rows, tables, problems, outputs, roots = [], [], [], {}, []
    fused: dict[str, tuple[Location, int]] = {}
    for path in paths:
        root = storage.location(path)
        if storage.file_type(root) != FileType.Directory:
            raise UserError(f"experiment directory not found: {storage.display(root)}")
        roots.append(root)
        running = running_sweep(root) is not None
        statuses = running_statuses(root) if running else {}
        folders = trial_folders(root)
        selected = _selected_labels(root)
        for trial_dir, files in progress(folders.items(), "loading trials", "trial", len(folders)):
            final = final_outputs(trial_dir, files)
            if final is None:
                if PARAMS_FILE in files:
                    problems.append(_problem(trial_dir, files, running))
                continue
            try:
                sizes = outputs_sizes(files, final_outputs_relative(files))
                top, seeds = _read_trial(final, sizes, root)
            except (OSError, DamagedFile) as error:
                if not running and not isinstance(error, DamagedFile):
                    raise
                problems.append(_unreadable(trial_dir, files, running, error))
                continue
            if running and scheduler_snapshot(top, statuses):  # the trial runs on
                problems.append(_problem(trial_dir, files, running))
                continue
            for record, folder, scores, row in seeds:
                if record.trial_id in outputs:
                    raise _twice(record.trial_id, outputs[record.trial_id], folder)
                outputs[record.trial_id] = folder
                if isinstance(top, FusedTrialRecord):
                    fused[record.trial_id] = (trial_dir, record.seed)
                rows.append({**row, "selected": record.label in selected})
                tables.append(scores)
    if not rows and not problems:
        raise UserError(f"no trials found in {', '.join(str(p) for p in paths)}")
    order = _numeric_order(_one_spec(rows))
    rows, tables = [rows[i] for i in order], [tables[i] for i in order]
    trials = pd.DataFrame(rows)
    if len(trials):
        trials.insert(2, "variant", variant_names(trials))
    return Experiment(
        trials=trials,
        scores=_stacked_frame(tables, [row["trial"] for row in rows], SCORE_COLUMNS),
        problems=pd.DataFrame(problems, columns=["path", "status", "error"]),
        outputs=outputs,
        paths=roots,
        fused=fused,
    )


def variant_names(trials: pd.DataFrame) -> pd.Series:
    """One row name per variant (a label at one setting): the label, plus its identifying
    settings (`relif_ray.sweep.labels.variant_name`) where trials of one label ran at several
    (a controller-sensitivity sweep: several (r*, eta), several static lambda0). Trials whose
    (r*, eta) was selected per seed (column `selected`, a `--select-from` sweep) are one
    setting, the paper's selected ReLiF, and keep the label. Where the trials ran on more than
    one architecture (`model.architecture`, a sweep's `--architectures`), every name ends in
    its architecture: `relif [mtan]`."""
    chosen = trials["selected"] if "selected" in trials else pd.Series(False, trials.index)
    fields = [field for field in SETTING_FIELDS if field in trials]
    settings = trials[~chosen].groupby("label")[fields].nunique(dropna=False)
    several = set(settings.index[(settings > 1).any(axis=1)])
    names = [
        variant_name(row.label, {field: getattr(row, field) for field in fields})
        if row.label in several and not selected
        else row.label
        for row, selected in zip(trials[["label", *fields]].itertuples(), chosen, strict=True)
    ]
    architectures = trials.get("architecture", pd.Series(HARD_SHARING, trials.index))
    if architectures.nunique() > 1:
        names = [f"{name} [{arch}]" for name, arch in zip(names, architectures, strict=True)]
    return pd.Series(names, index=trials.index)


def _selected_labels(root: Location) -> set[str]:
    """The labels whose (r*, eta) the sweep at `root` selected per seed (its
    `selection.csv`, written by `--select-from`); empty for other sweeps."""
    path = storage.join(root, SELECTION_FILE)
    if storage.file_type(path) != FileType.File:
        return set()
    table = storage.read_csv(path)
    with storage.reading(path):
        return set(table["label"])


def _read_trial(
    final: Location, sizes: dict[str, int], root: Location
) -> tuple[TrialRecord | FusedTrialRecord, list[tuple[TrialRecord, Location, pa.Table, dict]]]:
    """A finished trial's record (its trial.json) and, for each of its seeds (one, or each of a
    trial that trained several: `seed_records`), the seed's record, outputs folder, scores and
    trial row (`storage.DamagedFile` names a damaged file, or a file its trial.json lists that
    is not all there: `sizes`, the folder's files as listed, `check_complete`). Traces and
    representations are read when asked for: a damaged one is a one-line error then
    (`Experiment.traces` leaves it out with a warning)."""
    top = read_trial_record(final)
    check_complete(final, top, sizes)
    seeds = []
    for record, folder in seed_records(final, top):
        scores = storage.read_parquet(storage.join(folder, SCORES_FILE))
        with storage.reading(storage.join(folder, TRIAL_FILE)):  # what a row needs
            seeds.append((record, folder, scores, _trial_row(record, root, folder)))
    return top, seeds


def _twice(trial: str, first: Location, second: Location) -> UserError:
    """A trial id found in two outputs folders (two experiment directories with a trial in
    common)."""
    shown = f"{storage.display(first)} and {storage.display(second)}"
    return UserError(f"trial {trial} appears twice: {shown}")


def _unreadable(
    trial_dir: Location, files: dict[str, int], running: bool, error: Exception
) -> dict[str, str]:
    """A trial whose outputs cannot be read: still being written while a sweep runs, else
    damaged, which is said (`SkippedFile`) and listed."""
    if running:
        return _problem(trial_dir, files, running)
    skip(f"trial {storage.display(trial_dir).rstrip('/').rpartition('/')[2]}", error)
    return {"path": storage.display(trial_dir), "status": "damaged", "error": str(error)}


class SkippedFile(UserWarning):
    """A damaged file of an experiment that analysis left out (with the trial or the records
    it belongs to), and why: one line (`relif report` prints each as a warning)."""


def skip(what: str, damaged: Exception) -> None:
    """Warn that `what` is left out because of the damaged file `damaged` names."""
    warnings.warn(f"skipped {what}: {damaged}", SkippedFile, stacklevel=3)


def _result_records(trial_dir: Location) -> list[dict]:
    """The JSON lines of Tune's `result.json` in a trial folder ([] when it has none, or when
    it is damaged: said with `SkippedFile`; read again while a sweep may be rewriting it,
    `storage.read_settled`)."""
    place = storage.join(trial_dir, RESULT_FILE)
    running = running_sweep(storage.parent(trial_dir)) is not None
    try:
        return storage.read_settled(lambda: storage.read_json_lines(place), running)
    except FileNotFoundError:
        return []
    except DamagedFile as damaged:
        skip(f"the per-epoch records of {storage.display(trial_dir)}", damaged)
        return []


def _warn_missing_epochs(iterations: pd.Series, trial_dir: Location) -> None:
    """Warn (`SkippedFile`) when a trial's `result.json` lacks epochs before its last one. Ray
    Tune writes the file on the driver and copies it into storage from time to time; when it
    restarts a trial (a dead worker, `--resume`) it first copies the stored file back
    (`JsonLoggerCallback.log_trial_start`), so the records written since that copy, of epochs
    the restored checkpoint already holds, are lost for good."""
    missing = sorted(set(range(1, int(iterations.max()) + 1)) - set(iterations.astype(int)))
    if missing:
        lost = ", ".join(map(str, missing))
        reason = f"no record of epoch(s) {lost}: Ray Tune restarts a trial with its stored copy"
        skip(f"epoch(s) {lost} of the per-epoch records of {storage.display(trial_dir)}",
             DamagedFile(storage.join(trial_dir, RESULT_FILE), reason))  # fmt: skip


def _numeric_order(rows: list[dict]) -> list[int]:
    """Trials by experiment directory, architecture and label (first appearance), then r*,
    eta, lambda0 and seed as numbers: trial folder names sort as text (r0.28 before r0.2_,
    seed10 before seed2)."""
    if not rows:
        return []
    frame = pd.DataFrame(rows)[["experiment", "architecture", "label", *SETTING_FIELDS, "seed"]]
    for column in ("experiment", "architecture", "label"):
        frame[column] = pd.factorize(frame[column])[0]
    ordered = frame.sort_values(list(frame.columns), kind="stable", na_position="first")
    return [int(i) for i in ordered.index]


def _problem(trial_dir: Location, files: dict[str, int], running: bool) -> dict[str, str]:
    """A trial folder without outputs: "running" while a sweep still holds the experiment's
    lock (a trial that failed may yet be retried from its checkpoint; `error` then holds its
    last error), else "errored" (Tune's error.txt) or "incomplete" (its sweep was stopped)."""
    error = ""
    if ERROR_FILE in files:
        place = storage.join(trial_dir, ERROR_FILE)
        try:
            error = last_line(storage.read_settled(lambda: storage.read_text(place), running))
        except DamagedFile as damaged:
            skip(f"the error message of {storage.display(trial_dir)}", damaged)
    status = "running" if running else "errored" if ERROR_FILE in files else "incomplete"
    return {"path": storage.display(trial_dir), "status": status, "error": error}


def _one_spec(rows: list[dict]) -> list[dict]:
    """`rows`, checked: the trials of a benchmark that a data spec defines (the tabular
    benchmark) must share their tasks, as the audit reads one set of task declarations per
    data set."""
    tasks: dict[str, tuple[str, str]] = {}
    for row in rows:
        data = row["config"]["data"]
        found = repr(data.get("spec", {}).get("tasks"))
        first = tasks.setdefault(data["dataset"], (found, row["path"]))
        if first[0] != found:
            raise UserError(
                f"{row['path']}: its {data['dataset']} tasks differ from those of {first[1]}; "
                "report trials of different data specs apart"
            )
    return rows


def _trial_row(record: TrialRecord, root: Location, final: Location) -> dict:
    """One trial row: the record's identity, setting and status, its config, and every metric
    as `<split>_<metric>` (`split_metric`)."""
    config = record.config
    use_spec(config["data"])  # a benchmark that a data spec defines: its tasks are the spec's
    relif = config["relif"]
    row = {
        "trial": record.trial_id,
        "label": record.label,
        "method": record.method,
        "relif": record.relif,
        "seed": record.seed,
        "dataset": config["data"]["dataset"],
        "architecture": config["model"].get("architecture", HARD_SHARING),
        **setting_values(ReLiFConfig(**relif)),
        "steps": record.steps,
        "status": record.status or COMPLETED,
        "experiment": storage.display(root),
        "path": storage.display(final),
        "config": config,
    }
    for split, metrics in record.metrics.items():
        row.update({split_metric(split, name): value for name, value in metrics.items()})
    return row


def _stacked_frame(tables: list[pa.Table], trials: list[str], leading: list[str]) -> pd.DataFrame:
    """Per-trial tables stacked into one frame with a categorical `trial` column, converted
    from arrow once (per-file pandas conversion would dominate the load time)."""
    if not tables:
        return pd.DataFrame(columns=leading)
    counts = [table.num_rows for table in tables]
    combined = pa.concat_tables(tables, promote_options="permissive")
    frame = combined.to_pandas(strings_to_categorical=True)
    codes = np.repeat(np.arange(len(trials)), counts)
    frame.insert(0, "trial", pd.Categorical.from_codes(codes, categories=trials))
    return frame[leading + [c for c in frame.columns if c not in leading]]
