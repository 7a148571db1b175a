"""Pareto dominance and hypervolume of (Bias, Worst) points, and the (r*, eta) a
`--select-from` sweep runs at.

Bias lower is better, Worst higher is better (the paper's utility-fairness trade-off, Figure
2). Dominance and hypervolume are used by the Optuna sweep's `pareto.csv`, by the choice of
(r*, eta) from it (`select_settings`, a `Selection`) and by the analysis fronts and report."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pyarrow.fs import FileType

from relif_ray.errors import UserError
from relif_ray.experiment import storage
from relif_ray.experiment.layout import PARETO_FILE, SELECTION_FILE
from relif_ray.experiment.record import (
    ETA,
    LABEL,
    PARETO_METRICS,
    R_STAR,
    SEED,
    VAL_BIAS,
    VAL_MACRO,
    VAL_WORST,
)


def non_dominated(bias: np.ndarray, worst: np.ndarray) -> np.ndarray:
    """Mask of the points no other point dominates. q dominates p when q.bias <= p.bias and
    q.worst >= p.worst with at least one strict; identical points do not dominate each other.
    Points with a NaN coordinate are never on the front."""
    bias = np.asarray(bias, dtype=np.float64)
    worst = np.asarray(worst, dtype=np.float64)
    finite = np.isfinite(bias) & np.isfinite(worst)
    no_worse = (bias[:, None] <= bias[None, :]) & (worst[:, None] >= worst[None, :])
    better = (bias[:, None] < bias[None, :]) | (worst[:, None] > worst[None, :])
    dominates = no_worse & better & finite[:, None]
    return finite & ~dominates.any(axis=0)


HYPERVOLUME_REFERENCE: tuple[float, float] = (1.0, 0.0)
"""(Bias, Worst) reference point of every hypervolume: the worst value each coordinate can
take. Audit scores lie in [0, 1], so a gap is at most 1 and Bias = mean (gap - delta)_+ <= 1;
normalized task scores lie in [0, 1], so Worst >= 0. The hypervolume is then the area of the
unit (Bias, Worst) box that the point set dominates: 0 for no useful point, 1 for the ideal
(Bias 0, Worst 1). Fixed, so hypervolumes compare across methods, seeds and experiments."""


def hypervolume(
    bias: Sequence[float] | np.ndarray,
    worst: Sequence[float] | np.ndarray,
    reference: tuple[float, float] = HYPERVOLUME_REFERENCE,
) -> float:
    """Area of the (Bias, Worst) region the points dominate up to `reference` (Bias lower is
    better, Worst higher is better): the union of the boxes [bias_i, ref_bias] x [ref_worst,
    worst_i], the hypervolume indicator of multi-objective optimisation in two dimensions.
    Points with a NaN coordinate, or not strictly better than the reference in both
    coordinates, add nothing; dominated points add nothing either, so the hypervolume of a
    point set is that of its Pareto front (`non_dominated`)."""
    bias = np.asarray(bias, dtype=np.float64)
    worst = np.asarray(worst, dtype=np.float64)
    ref_bias, ref_worst = reference
    keep = np.isfinite(bias) & np.isfinite(worst) & (bias < ref_bias) & (worst > ref_worst)
    order = np.argsort(bias[keep], kind="stable")
    bias, worst = bias[keep][order], worst[keep][order]
    # Left to right in Bias, the region's height is the best Worst of the points seen so far.
    height = np.maximum.accumulate(worst) - ref_worst if worst.size else worst
    width = np.append(bias[1:], ref_bias) - bias
    return float(np.sum(width * height))


def pareto_front(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of each `study` that no other row of that study dominates in (val_bias,
    val_worst), sorted by study and val_bias, with `val_hypervolume`: the hypervolume of the
    study's (val_bias, val_worst) points (`hypervolume`), the same on each row of a study."""
    keep = np.zeros(len(rows), dtype=bool)
    volumes = np.zeros(len(rows), dtype=np.float64)
    for positions in rows.groupby(STUDY, sort=True).indices.values():
        group = rows.iloc[positions]
        keep[positions] = non_dominated(group[VAL_BIAS], group[VAL_WORST])
        volumes[positions] = hypervolume(group[VAL_BIAS], group[VAL_WORST])
    front = rows.assign(val_hypervolume=volumes)[keep]
    return front.sort_values([STUDY, VAL_BIAS]).reset_index(drop=True)


STUDY = "study"
"""The column of `pareto.csv` that names a trial's Optuna study (`TuneKeys.study`)."""
PARETO_COLUMNS = (STUDY, *PARETO_METRICS)
"""The columns of `<experiment>/pareto.csv` (`PARETO_FILE`) of an Optuna sweep, each study's
Pareto set on validation: the study, then values each trial reports to Tune under the same
names (`relif_ray.tuning.launch.write_pareto`); the sweep writes `val_hypervolume` after them
(`pareto_front`). `--select-from` reads them."""
PARETO_NUMBERS = (SEED, R_STAR, ETA, VAL_BIAS, VAL_WORST, VAL_MACRO)
"""The columns of `PARETO_COLUMNS` that hold numbers."""
_TOLERANCE_SLACK = 1e-12
"""Float slack of the tolerance edge: Worst exactly `tolerance` below the best is within it."""


def read_pareto(experiment: str) -> pd.DataFrame:
    """The `pareto.csv` of the experiment directory (a path or storage URI), columns checked."""
    root = storage.location(experiment, "--select-from")
    if storage.file_type(root) != FileType.Directory:
        raise UserError(f"--select-from: experiment directory not found: {experiment}")
    path = storage.join(root, PARETO_FILE)
    if storage.file_type(path) != FileType.File:
        raise UserError(
            f"--select-from: no {PARETO_FILE} in {storage.display(root)} "
            "(it is written by a finished --search optuna sweep)"
        )
    try:
        table = storage.read_csv(path)
        with storage.reading(path):  # a missing column, or text in a number column
            missing = [column for column in PARETO_COLUMNS if column not in table.columns]
            if missing:
                raise ValueError(f"missing column(s) {', '.join(missing)}")
            for column in PARETO_NUMBERS:
                table[column] = pd.to_numeric(table[column])
    except storage.DamagedFile as error:
        raise UserError(f"--select-from: {error}") from None
    return table


def select_settings(front: pd.DataFrame, worst_tolerance: float) -> pd.DataFrame:
    """One (r*, eta) per (label, seed) from a `pareto.csv` table, on validation numbers only.

    The paper selects MIMIC-III's (r*, eta) "on validation per data-seed group" without stating
    a rule; ours: among the study's points whose validation Worst is within `worst_tolerance`
    of the study's best validation Worst, the one with the lowest validation Bias (ties: higher
    validation Worst, then smaller r*, then smaller eta). Utility is kept within the tolerance
    and Bias, what ReLiF is for, decides. Returns the chosen rows sorted by label and seed.
    """
    if not (math.isfinite(worst_tolerance) and worst_tolerance >= 0):
        raise UserError(f"--select-worst-tolerance: must be >= 0, got {worst_tolerance:g}")
    rows = front.dropna(subset=[VAL_BIAS, VAL_WORST, R_STAR, ETA])
    chosen = []
    for _, group in rows.groupby([LABEL, SEED], sort=True):
        floor = group[VAL_WORST].max() - worst_tolerance
        near_best = group[group[VAL_WORST] >= floor - _TOLERANCE_SLACK]
        ranked = near_best.sort_values(
            [VAL_BIAS, VAL_WORST, R_STAR, ETA],
            ascending=[True, False, True, True],
            kind="stable",
        )
        chosen.append(ranked.iloc[0])
    return pd.DataFrame(chosen, columns=front.columns).reset_index(drop=True)


@dataclass(frozen=True)
class Selection:
    """The `select_settings` rows chosen from the `pareto.csv` of the search `source` (one per
    label and seed), at `worst_tolerance`."""

    chosen: pd.DataFrame
    source: str
    worst_tolerance: float

    def settings(self) -> dict[tuple[str, int], tuple[float, float]]:
        """(label, seed) -> (r*, eta)."""
        return {
            (row.label, int(row.seed)): (float(row.r_star), float(row.eta))
            for row in self.chosen.itertuples()
        }

    def lines(self) -> list[str]:
        """What the sweep prints about its choice."""
        lines = [
            "(r*, eta) selected on validation: lowest val Bias within "
            f"{self.worst_tolerance:g} of the study's best val Worst"
        ]
        lines += [
            f"  {row.label} seed {int(row.seed)}: r*={row.r_star:g} eta={row.eta:g} "
            f"(val Bias {row.val_bias:.4f}, val Worst {row.val_worst:.4f}; "
            f"study {row.study}, trial {row.trial_id})"
            for row in self.chosen.itertuples()
        ]
        return lines


def record_selection(experiment_dir: str, selection: Selection) -> None:
    """`<experiment>/selection.csv`: the chosen pareto.csv rows, their source and tolerance."""
    table = selection.chosen.assign(
        source=selection.source, worst_tolerance=selection.worst_tolerance
    )
    path = storage.join(storage.location(experiment_dir), SELECTION_FILE)
    storage.write_text(path, table.to_csv(index=False))
