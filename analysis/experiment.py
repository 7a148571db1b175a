"""Read experiment directories offline (no Ray, no re-training) into pandas DataFrames.

An experiment directory is what a sweep leaves in storage: one folder per trial, each with
Ray Tune's checkpoints; the final checkpoint holds `outputs/` (see `relif_ray.outputs`).
Trials that errored (Tune's `error.txt`) or never finished are listed, never silently dropped.

Loading reads each trial's `trial.json` and `scores.parquet` (one arrow conversion for all
trials: 1,000 trials load in about a second); per-step traces and representations are read
only when asked for.
"""

from __future__ import annotations

import json
import os
import re
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from relif_ray.errors import UserError
from relif_ray.experiment_lock import running_sweep
from relif_ray.outputs import OUTPUTS_DIR, TRIAL_FILE, read_representations

_CHECKPOINT = re.compile(r"checkpoint_(\d+)$")
SCORE_COLUMNS = ["trial", "split", "task", "example_id", "score", "valid"]


class Experiment:
    """All finished trials of one or more experiment directories, and the unfinished ones.

    trials: one row per finished trial: trial, label (method label, e.g. "relif"), variant
        (the label, plus " (r*=.., eta=..)" where one label was run at several controller
        settings), method, relif, seed, dataset, r_star, eta, steps, experiment, path, config
        (dict), then every metric as <split>_<metric> (e.g. val_worst, val_seg_miou).
    scores: trial, split, task, example_id, score (raw audit score as stored), valid.
    traces: trial, step, loss_<task>, weight_<task>, and ReLiF's lambda, r, r_ema, tau, kappa,
        loss_lip where enabled (read on first access).
    problems: trial folders without outputs: path, status ("errored", "running" while a sweep
        still writes the experiment, or "incomplete"), error.
    outputs: trial id -> its outputs folder.
    """

    def __init__(
        self,
        trials: pd.DataFrame,
        scores: pd.DataFrame,
        problems: pd.DataFrame,
        outputs: dict[str, Path],
        paths: list[Path],
    ) -> None:
        self.trials = trials
        self.scores = scores
        self.problems = problems
        self.outputs = outputs
        self.paths = paths

    @cached_property
    def traces(self) -> pd.DataFrame:
        trials = list(self.outputs)
        tables = [pq.ParquetFile(self.outputs[t] / "trace.parquet").read() for t in trials]
        return _stacked_frame(tables, trials, ["trial", "step"])

    def trace(self, trial: str) -> pd.DataFrame:
        """The per-step trace of one trial (column `trial` first)."""
        table = pd.read_parquet(self.outputs[trial] / "trace.parquet")
        table.insert(0, "trial", trial)
        return table

    def representations(self, trial: str, split: str = "val") -> tuple[np.ndarray, np.ndarray]:
        """(example_ids, (N, D) shared representations) of one trial and split."""
        return read_representations(self.outputs[trial], split)


def load(*paths: str | Path) -> Experiment:
    """Load one or more experiment directories (their trials are concatenated in the given
    order). A missing directory or one without any trial folder is a one-line UserError."""
    if not paths:
        raise UserError("analysis.load: no experiment directory given")
    rows, tables, problems, outputs, roots = [], [], [], {}, []
    for path in paths:
        root = Path(path)
        if not root.is_dir():
            raise UserError(f"experiment directory not found: {root}")
        roots.append(root)
        running = running_sweep(root) is not None
        for trial_dir in sorted(Path(entry.path) for entry in os.scandir(root) if entry.is_dir()):
            final = _final_outputs(trial_dir)
            if final is None:
                if (trial_dir / "params.json").exists():
                    problems.append(_problem(trial_dir, running))
                continue
            try:
                info = json.loads((final / TRIAL_FILE).read_text())
                scores = pq.ParquetFile(final / "scores.parquet").read()
            except (OSError, ValueError):
                if not running:
                    raise
                problems.append(_problem(trial_dir, running))  # final checkpoint being copied
                continue
            trial = info["trial_id"]
            if trial in outputs:
                raise UserError(f"trial {trial} appears twice: {outputs[trial]} and {final}")
            outputs[trial] = final
            rows.append(_trial_row(info, root, final))
            tables.append(scores)
    if not rows and not problems:
        raise UserError(f"no trials found in {', '.join(str(p) for p in paths)}")
    trials = pd.DataFrame(rows)
    if len(trials):
        trials.insert(2, "variant", variant_names(trials))
    return Experiment(
        trials=trials,
        scores=_stacked_frame(tables, [row["trial"] for row in rows], SCORE_COLUMNS),
        problems=pd.DataFrame(problems, columns=["path", "status", "error"]),
        outputs=outputs,
        paths=roots,
    )


def variant_names(trials: pd.DataFrame) -> pd.Series:
    """One row name per method setting: the label, plus the controller setting where trials
    of one label ran at several (r*, eta) (e.g. a controller-sensitivity sweep)."""
    settings = trials.groupby("label")[["r_star", "eta"]].nunique(dropna=False)
    several = set(settings.index[(settings > 1).any(axis=1)])
    return pd.Series(
        [
            f"{label} (r*={r_star:g}, eta={eta:g})" if label in several else label
            for label, r_star, eta in zip(
                trials["label"], trials["r_star"], trials["eta"], strict=True
            )
        ],
        index=trials.index,
    )


def _final_outputs(trial_dir: Path) -> Path | None:
    """The outputs folder of the trial's latest checkpoint that has one."""
    candidates = []
    for entry in os.scandir(trial_dir):
        match = _CHECKPOINT.match(entry.name)
        if match and entry.is_dir():
            outputs = Path(entry.path) / OUTPUTS_DIR
            if (outputs / TRIAL_FILE).is_file():
                candidates.append((int(match.group(1)), outputs))
    return max(candidates)[1] if candidates else None


def _problem(trial_dir: Path, running: bool) -> dict[str, str]:
    """A trial folder without outputs: "running" while a sweep still holds the experiment's
    lock (a trial that failed may yet be retried from its checkpoint; `error` then holds its
    last error), else "errored" (Tune's error.txt) or "incomplete" (its sweep was stopped)."""
    error_file = trial_dir / "error.txt"
    error = ""
    if error_file.exists():
        lines = [line for line in error_file.read_text().splitlines() if line.strip()]
        error = lines[-1] if lines else ""
    status = "running" if running else "errored" if error_file.exists() else "incomplete"
    return {"path": str(trial_dir), "status": status, "error": error}


def _trial_row(info: dict, root: Path, final: Path) -> dict:
    config = info["config"]
    relif = config["relif"]
    row = {
        "trial": info["trial_id"],
        "label": info["label"],
        "method": info["method"],
        "relif": info["relif"],
        "seed": info["seed"],
        "dataset": config["data"]["dataset"],
        "r_star": relif["r_star"] if info["relif"] else np.nan,
        "eta": relif["eta"] if info["relif"] else np.nan,
        "steps": info["steps"],
        "experiment": str(root),
        "path": str(final),
        "config": config,
    }
    for split, metrics in info["metrics"].items():
        row.update({f"{split}_{name}": value for name, value in metrics.items()})
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
