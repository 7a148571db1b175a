"""Fixed-delta audits of every trial of an experiment, offline (paper Algorithm 1).

`ExperimentAudit` applies the shared audit interface (`relif_ray.analysis.audit_scores`) and then
the library's audit (`relif_ray.audit`) to every finished trial, with one set of audit settings
(N_eval, S, pair_seed, eval_seed) for all of them:

- `gaps(split)`: each trial's S sampled gaps |p_a(x) - p_b(y)| per task pair, reusable for any
  delta (Bias/VR at many deltas cost one sort per task pair, `relif_ray.audit.bias_curve`).
- `distances()`: for the same sampled VALIDATION pairs, the cosine-induced distances
  (1 - cos(f(x), f(y))) / 2 of the trial's own L2-normalised shared representations. Their
  mean per task pair is the method-induced threshold delta_m,ab of
  `relif_ray.audit_thresholds.induced_thresholds` (a drift diagnostic, never the audit); those
  of a reference label, pooled, are the distribution delta_ref is read from
  (`relif_ray.analysis.delta`).

The pools and pairs depend only on each task's valid example ids and the seeds, so trials with
the same valid examples share one sample: it is drawn once, by `relif_ray.audit.sample_pairs`,
and reused (this is what makes 1,000 trials audit in about a second). The results equal
`relif_ray.audit.audit_gaps` and `relif_ray.audit_thresholds.pair_distances` /
`induced_thresholds` called on each trial (tested).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from relif_ray.analysis.audit_scores import audit_scores, categorical
from relif_ray.analysis.experiment import Experiment
from relif_ray.audit import AuditGaps, AuditSettings, PairKey, bias_curve, sample_pairs
from relif_ray.audit_thresholds import cosine_distances, unit_rows
from relif_ray.errors import UserError
from relif_ray.squash import PAPER_INTERFACE


@dataclass(frozen=True)
class TrialSample:
    """One trial's valid audit scores of one split and its sampled pairs.

    task, example_id, score: the valid rows ordered by (task, example_id);
    pairs: task pair "a|b" -> (row positions x of task a, row positions y of task b).
    """

    task: np.ndarray
    example_id: np.ndarray
    score: np.ndarray
    pairs: dict[PairKey, tuple[np.ndarray, np.ndarray]]

    def gaps(self) -> AuditGaps:
        return AuditGaps(
            {k: np.abs(self.score[x] - self.score[y]) for k, (x, y) in self.pairs.items()}
        )


class ExperimentAudit:
    """Audits of all finished trials of an experiment under one set of settings, on one audit
    interface (`relif_ray.squash.AUDIT_INTERFACES`; default the paper's squash)."""

    def __init__(
        self,
        experiment: Experiment,
        settings: AuditSettings | None = None,
        interface: str = PAPER_INTERFACE,
    ) -> None:
        self.experiment = experiment
        self.settings = settings or AuditSettings()
        self.interface = interface
        self.scores = audit_scores(experiment, interface)
        self._samples: dict[str, dict[str, TrialSample]] = {}
        self._gaps: dict[str, dict[str, AuditGaps]] = {}
        self._distances: dict[str, dict[PairKey, np.ndarray]] = {}

    def under(self, interface: str) -> ExperimentAudit:
        """The same trials and settings on another audit interface. The pools and pairs
        depend only on the valid example ids and the seeds, so they are the same draws; the
        representation distances over them are shared, not recomputed."""
        other = ExperimentAudit(self.experiment, self.settings, interface)
        other._distances = self._distances
        return other

    @property
    def trial_ids(self) -> list[str]:
        return list(self.experiment.trials["trial"]) if len(self.experiment.trials) else []

    def samples(self, split: str) -> dict[str, TrialSample]:
        """Every trial's valid scores of `split` and its sampled pairs (cached)."""
        if split not in self._samples:
            self._samples[split] = self._draw(split)
        return self._samples[split]

    def gaps(self, split: str) -> dict[str, AuditGaps]:
        """trial -> its sampled gaps on `split` (cached)."""
        if split not in self._gaps:
            self._gaps[split] = {t: s.gaps() for t, s in self.samples(split).items()}
        return self._gaps[split]

    def fixed(self, deltas: Sequence[float], split: str) -> pd.DataFrame:
        """Aggregate Bias and VR of every trial at every held-fixed delta (`AuditGaps.audit`):
        trial, delta, bias, vr."""
        rows = [
            (trial, delta, result.bias, result.vr)
            for trial, gaps in self.gaps(split).items()
            for delta in deltas
            for result in [gaps.audit(float(delta))]
        ]
        return pd.DataFrame(rows, columns=["trial", "delta", "bias", "vr"])

    def curve(self, deltas: Sequence[float], split: str) -> pd.DataFrame:
        """Bias and VR of every trial over a grid of deltas (`relif_ray.audit.bias_curve`, one
        sort per task pair): trial, delta, bias, vr."""
        frames = [
            bias_curve(gaps, deltas).assign(trial=trial) for trial, gaps in self.gaps(split).items()
        ]
        if not frames:
            return pd.DataFrame(columns=["trial", "delta", "bias", "vr"])
        return pd.concat(frames, ignore_index=True)[["trial", "delta", "bias", "vr"]]

    def distances(self, trial: str) -> dict[PairKey, np.ndarray]:
        """Cosine-induced distances (1 - cos) / 2 of the trial's shared validation
        representations over its sampled validation pairs, per task pair (cached)."""
        if trial not in self._distances:
            sample = self.samples("val")[trial]
            ids, matrix = self.experiment.representations(trial, "val")
            positions = pd.Index(ids).get_indexer(sample.example_id)
            if (positions < 0).any():
                missing = sample.example_id[positions < 0][0]
                raise UserError(
                    f"trial {trial}: no validation representation for example_id {missing}"
                )
            unit = unit_rows(np.asarray(matrix, dtype=np.float64)[positions])
            self._distances[trial] = {
                key: cosine_distances(unit, x, y) for key, (x, y) in sample.pairs.items()
            }
        return self._distances[trial]

    def induced(self) -> pd.DataFrame:
        """Validation-induced thresholds delta_m,ab: trial, pair, induced (one row per task
        pair), and each trial's mean over task pairs as pair "mean"."""
        rows = []
        for trial in self.trial_ids:
            per_pair = {key: float(values.mean()) for key, values in self.distances(trial).items()}
            rows += [(trial, key, value) for key, value in per_pair.items()]
            rows.append((trial, "mean", float(np.mean(list(per_pair.values())))))
        return pd.DataFrame(rows, columns=["trial", "pair", "induced"])

    def _sample(
        self, tasks: np.ndarray, ids: np.ndarray, source: str
    ) -> dict[PairKey, tuple[np.ndarray, np.ndarray]]:
        """`relif_ray.audit.sample_pairs` on rows already checked by `_check_values`."""
        names = sorted(set(tasks))
        if len(names) < 2:
            raise UserError(f"{source}: need valid scores of at least two tasks")
        if any("|" in name for name in names):
            raise UserError(f"{source}: task names must not contain '|'")
        frame = pd.DataFrame({"task": pd.Series(tasks, dtype=object), "example_id": ids})
        return sample_pairs(frame, settings=self.settings)

    def _draw(self, split: str) -> dict[str, TrialSample]:
        scores = self.scores
        frame = scores[(scores["split"] == split) & scores["valid"]]
        trials = categorical(frame["trial"])
        tasks = categorical(frame["task"])
        ids = frame["example_id"].to_numpy()
        values = frame["score"].to_numpy(dtype=np.float64)
        names = np.asarray(tasks.categories.astype(str), dtype=object)
        order = np.lexsort((ids, tasks.codes, trials.codes))
        trial_codes, task_codes = trials.codes[order], tasks.codes[order]
        ids, values = ids[order], values[order]
        _check_values(trial_codes, task_codes, ids, values, trials.categories, names, split)
        starts = np.searchsorted(trial_codes, np.arange(len(trials.categories) + 1))
        cache: dict[bytes, dict[PairKey, tuple[np.ndarray, np.ndarray]]] = {}
        samples = {}
        for code, trial in enumerate(trials.categories):
            rows = slice(starts[code], starts[code + 1])
            if rows.start == rows.stop:
                continue
            task_names = names[task_codes[rows]]
            key = hashlib.blake2b(
                "|".join(names).encode() + task_codes[rows].tobytes() + ids[rows].tobytes()
            ).digest()
            if key not in cache:
                cache[key] = self._sample(task_names, ids[rows], f"trial {trial} ({split})")
            samples[str(trial)] = TrialSample(task_names, ids[rows], values[rows], cache[key])
        missing = [t for t in self.trial_ids if t not in samples]
        if missing:
            raise UserError(f"trial {missing[0]}: no valid audit scores on split {split!r}")
        return {t: samples[t] for t in self.trial_ids}


def _check_values(
    trial_codes: np.ndarray,
    task_codes: np.ndarray,
    ids: np.ndarray,
    values: np.ndarray,
    trials: pd.Index,
    tasks: np.ndarray,
    split: str,
) -> None:
    """One-line errors for audit scores outside [0, 1] and duplicate (task, example) rows,
    checked for all trials at once (sorted by trial, task, example_id)."""
    bad = np.flatnonzero(~(np.isfinite(values) & (values >= 0) & (values <= 1)))
    if bad.size:
        i = bad[0]
        raise UserError(
            f"trial {trials[trial_codes[i]]} ({split}): audit score of task "
            f"{tasks[task_codes[i]]!r} must be a finite number in [0, 1], got {values[i]!r}"
        )
    same = (np.diff(trial_codes) == 0) & (np.diff(task_codes) == 0) & (np.diff(ids) == 0)
    if same.any():
        i = np.flatnonzero(same)[0]
        raise UserError(
            f"trial {trials[trial_codes[i]]} ({split}): duplicate scores of task "
            f"{tasks[task_codes[i]]!r} for example_id {ids[i]}"
        )
