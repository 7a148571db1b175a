"""The live fixed-delta audit of a trial's validation scores (`val_bias`, `val_vr`): what
each validated epoch reports, for the progress table, the schedulers and the Optuna studies.

Scores that are not probabilities are squashed (`relif_ray.squash.squash`) with the trial's
same-seed ERM constants where it has them, else with the quantiles of the same trial's
validation scores; then Algorithm 1 (`relif_ray.audit.fixed_delta_audit`) at the sweep's
delta. A progress and search signal only: the official fixed-delta numbers are computed at
analysis time (`analysis`). Plain numpy, no Ray.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from relif_ray.audit import AuditGaps, AuditResult, PairKey, sample_pairs, validate_scores
from relif_ray.squash import squash, squash_bounds


class LiveValidationAudit:
    """The live fixed-delta audit of one seed's validation scores, epoch after epoch: each
    split's raw scores squashed with `constants` (task -> [q10, q90]) where given, else
    self-squashed (the module docstring), then Algorithm 1 (`fixed_delta_audit`).

    Rows that are invalid or not finite are dropped; None when fewer than two tasks remain.
    Algorithm 1's pools and pairs depend on the rows (their tasks and example ids), not on
    the scores, and a trial's validation split gives the same rows every epoch: they are
    sampled once and again only when the rows change (a score turning NaN), so each epoch
    costs a squash and the gaps. The numbers are `fixed_delta_audit`'s (tested).
    """

    def __init__(
        self,
        probability_tasks: set[str],
        delta: float,
        constants: dict[str, list[float]] | None = None,
    ) -> None:
        self.probability_tasks = probability_tasks
        self.delta = delta
        self.constants = constants or {}
        self._rows: list[np.ndarray] | None = None
        """The rows the pairs were sampled on: usable mask, task, example_id."""
        self._tasks: dict[str, np.ndarray] = {}
        """Each task's positions among the usable rows, in row order."""
        self._pairs: dict[PairKey, tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, scores: pd.DataFrame) -> AuditResult | None:
        values = scores["score"].to_numpy(dtype=np.float64)
        usable = scores["valid"].to_numpy(dtype=bool) & np.isfinite(values)
        rows = [usable, scores["task"].to_numpy(), scores["example_id"].to_numpy()]
        same = self._rows is not None and all(map(np.array_equal, rows, self._rows))
        if not same:
            self._rows, self._pairs = rows, {}
            kept = scores[usable]
            self._tasks = {
                str(task): positions
                for task, positions in kept.groupby("task", sort=False).indices.items()
            }
        if len(self._tasks) < 2:
            return None
        squashed = self._squashed(values[usable])
        if not same:
            self._pairs = sample_pairs(validate_scores(kept.assign(score=squashed)))
        gaps = {key: np.abs(squashed[x] - squashed[y]) for key, (x, y) in self._pairs.items()}
        return AuditGaps(gaps).audit(self.delta)

    def _squashed(self, values: np.ndarray) -> np.ndarray:
        """The usable rows' audit scores: raw scores squashed per task, clipped to [0, 1]."""
        squashed = np.empty_like(values)
        for task, positions in self._tasks.items():
            own = values[positions]
            if task not in self.probability_tasks:
                low, high = self.constants.get(task) or squash_bounds(own)
                own = squash(own, low, high)
            squashed[positions] = np.clip(own, 0.0, 1.0)
        return squashed
