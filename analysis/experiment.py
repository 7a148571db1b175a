"""Read experiment directories offline (no Ray, no re-training) into pandas DataFrames.

An experiment directory is what a sweep leaves in storage: one folder per trial, each with
Ray Tune's checkpoints; the final checkpoint holds `outputs/` (see `relif_ray.outputs`).
Trials that errored (Tune's `error.txt`) or never finished are listed, never silently dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from relif_ray.errors import UserError
from relif_ray.outputs import OUTPUTS_DIR, TRIAL_FILE, read_representations, read_trial_info

_CHECKPOINT_INDEX = re.compile(r"checkpoint_(\d+)$")


@dataclass
class Experiment:
    """All trials of one or more experiment directories.

    trials: one row per finished trial: trial, label (method label, e.g. "relif"), method,
        relif, seed, r_star, eta, steps, experiment, path, config (dict), then every metric as
        <split>_<metric> (e.g. val_worst, val_seg_miou).
    scores: trial, split, task, example_id, score (raw audit score), valid.
    traces: trial, step, loss_<task>, weight_<task>, and ReLiF's lambda, r, r_ema, tau, kappa,
        loss_lip where enabled.
    problems: trial folders without outputs: path, status ("errored" or "incomplete"), error.
    """

    trials: pd.DataFrame
    scores: pd.DataFrame
    traces: pd.DataFrame
    problems: pd.DataFrame
    outputs: dict[str, Path] = field(default_factory=dict)

    def representations(self, trial: str, split: str = "val") -> tuple[np.ndarray, np.ndarray]:
        """(example_ids, (N, D) shared representations) of one trial and split."""
        return read_representations(self.outputs[trial], split)


def load(*paths: str | Path) -> Experiment:
    """Load one or more experiment directories (their trials are concatenated)."""
    if not paths:
        raise UserError("analysis.load: no experiment directory given")
    rows, scores, traces, problems, outputs = [], [], [], [], {}
    for path in paths:
        root = Path(path)
        if not root.is_dir():
            raise UserError(f"experiment directory not found: {root}")
        for trial_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            final = _final_outputs(trial_dir)
            if final is None:
                if (trial_dir / "params.json").exists():
                    problems.append(_problem(trial_dir))
                continue
            info = read_trial_info(final)
            trial = info["trial_id"]
            outputs[trial] = final
            rows.append(_trial_row(info, root, final))
            scores.append(pd.read_parquet(final / "scores.parquet").assign(trial=trial))
            traces.append(pd.read_parquet(final / "trace.parquet").assign(trial=trial))
    if not rows and not problems:
        raise UserError(f"no trials found in {', '.join(str(p) for p in paths)}")
    return Experiment(
        trials=pd.DataFrame(rows),
        scores=_concat(scores, ["trial", "split", "task", "example_id", "score", "valid"]),
        traces=_concat(traces, ["trial", "step"]),
        problems=pd.DataFrame(problems, columns=["path", "status", "error"]),
        outputs=outputs,
    )


def _final_outputs(trial_dir: Path) -> Path | None:
    """The outputs folder of the trial's latest checkpoint that has one."""
    candidates = []
    for trial_file in trial_dir.glob(f"checkpoint_*/{OUTPUTS_DIR}/{TRIAL_FILE}"):
        match = _CHECKPOINT_INDEX.search(trial_file.parent.parent.name)
        if match:
            candidates.append((int(match.group(1)), trial_file.parent))
    return max(candidates)[1] if candidates else None


def _problem(trial_dir: Path) -> dict[str, str]:
    error_file = trial_dir / "error.txt"
    if error_file.exists():
        lines = [line for line in error_file.read_text().splitlines() if line.strip()]
        return {"path": str(trial_dir), "status": "errored", "error": lines[-1] if lines else ""}
    return {"path": str(trial_dir), "status": "incomplete", "error": ""}


def _trial_row(info: dict, root: Path, final: Path) -> dict:
    relif = info["config"]["relif"]
    row = {
        "trial": info["trial_id"],
        "label": info["label"],
        "method": info["method"],
        "relif": info["relif"],
        "seed": info["seed"],
        "r_star": relif["r_star"] if info["relif"] else np.nan,
        "eta": relif["eta"] if info["relif"] else np.nan,
        "steps": info["steps"],
        "experiment": str(root),
        "path": str(final),
        "config": info["config"],
    }
    for split, metrics in info["metrics"].items():
        row.update({f"{split}_{name}": value for name, value in metrics.items()})
    return row


def _concat(frames: list[pd.DataFrame], leading: list[str]) -> pd.DataFrame:
    if not frames:
        return pd.DataFrame(columns=leading)
    table = pd.concat(frames, ignore_index=True)
    return table[leading + [c for c in table.columns if c not in leading]]
