"""One split evaluated on the device: native metrics, raw audit scores and representations.

The loop (`SplitCollector.add`, one call per batch) leaves every batch's results where the
model put them: the task metric accumulators keep their sums and counts on the device
(`relif_ray.tasks.base.MetricAccumulator`), and the example ids, the raw audit scores p_k with
their validity and the shared representations are kept as device tensors. Nothing in the loop
reads a device value on the host, so on a GPU the host queues the next batch while the device
still works on this one. `SplitCollector.result` then copies each quantity to the host once
per split and builds the tables (`EvalResult`): one pandas frame, not one per batch and task.

The rows of `EvalResult.scores` come batch by batch and, within a batch, task by task, as the
per-batch evaluation before this one wrote them. Tasks that declare outcomes (`Task.outcomes`:
the clinical ones) also leave their labels and predictions per example, for the group audit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from relif_ray.experiment.schema import OUTCOME_COLUMNS
from relif_ray.squash import squash_bounds
from relif_ray.tasks.base import Batch, MetricAccumulator, ModelOutput, Task, worst_and_macro


@dataclass
class EvalResult:
    """Utility metrics, per-example raw audit scores and shared representations of one split
    (`relif_ray.engine.TrainingRun.evaluate`); a finished trial writes them to its outputs
    (`relif_ray.experiment.outputs`).

    metrics: flat dict, e.g. seg_miou, depth_rmse, seg_score (normalized), worst, macro.
    scores: one row per (task, example): task, example_id, score (raw p_k), valid.
    representations: (N, D) float32, row i belongs to example_ids[i].
    outcomes: one row per counted entry of a task with outcomes (`Task.outcomes`): task,
        example_id, position (the step, or the label of a multi-label task; 0 for a per-stay
        label), label, prediction (float32); empty where no task has outcomes. Built from
        `outcomes_from` when first read: a trial validates every epoch and writes outcomes
        once, and on ACTG 175 the table is half of an epoch's validation time.
    names: the split's example names (`Split.example_names`: a stay's file or id), indexed
        by example_id; None where the split has none.
    """

    metrics: dict[str, float]
    scores: pd.DataFrame
    representations: np.ndarray
    example_ids: np.ndarray
    names: list[str] | None = None
    outcomes_from: Callable[[], pd.DataFrame] | None = field(default=None, repr=False)

    @cached_property
    def outcomes(self) -> pd.DataFrame:
        if self.outcomes_from is None:
            return pd.DataFrame(columns=OUTCOME_COLUMNS)
        return self.outcomes_from()

    def squash_constants(self, tasks: list[str]) -> dict[str, list[float]]:
        """task -> [q10, q90] of its valid raw scores here: on an ERM reference run's
        validation split, the squash constants of its seed (`relif_ray.squash`,
        `relif_ray.reference`)."""
        valid = self.scores[self.scores["valid"].astype(bool)]
        return {
            task: squash_bounds(valid.loc[valid["task"] == task, "score"].to_numpy())
            for task in tasks
        }


@dataclass
class SplitCollector:
    """The device-side results of one split's batches, until `result` copies them once."""

    tasks: list[Task]
    accumulators: dict[str, MetricAccumulator] = field(init=False)
    example_ids: list[Tensor] = field(default_factory=list)
    representations: list[Tensor] = field(default_factory=list)
    scores: list[Tensor] = field(default_factory=list)
    """Per batch and task, in that order: the raw audit scores (B,)."""
    valid: list[Tensor] = field(default_factory=list)
    outcomes: dict[str, list[dict[str, Tensor]]] = field(default_factory=dict)
    """Per task with outcomes, per batch: its flattened example_id, position, label,
    prediction and keep tensors."""

    def __post_init__(self) -> None:
        self.accumulators = {task.name: task.new_metrics() for task in self.tasks}

    def add(self, batch: Batch, output: ModelOutput) -> None:
        """One batch's predictions, on the device they are on; no host synchronisation."""
        self.example_ids.append(batch["example_id"])
        self.representations.append(output.representation.float())
        for task in self.tasks:
            prediction, target = output.predictions[task.name], batch[task.name]
            self.accumulators[task.name].update(prediction, target)
            score, valid = task.audit_score(output, batch)
            self.scores.append(score.float())
            self.valid.append(valid)
            outcome = task.outcomes(prediction, target)
            if outcome is not None:
                rows, width = outcome.keep.shape
                positions = torch.arange(width, device=outcome.keep.device)
                self.outcomes.setdefault(task.name, []).append(
                    {
                        "example_id": batch["example_id"][:, None].expand(rows, width).flatten(),
                        "position": positions.expand(rows, width).flatten(),
                        "label": outcome.label.float().flatten(),
                        "prediction": outcome.prediction.float().flatten(),
                        "keep": outcome.keep.flatten(),
                    }
                )

    def result(self) -> EvalResult:
        """Every quantity copied to the host once: metrics, scores table, representations."""
        metrics: dict[str, float] = {}
        normalized: dict[str, float] = {}
        for task in self.tasks:
            native = self.accumulators[task.name].compute()
            metrics.update({f"{task.name}_{key}": value for key, value in native.items()})
            normalized[task.name] = task.normalized_score(native)
            metrics[f"{task.name}_score"] = normalized[task.name]
        metrics["worst"], metrics["macro"] = worst_and_macro(normalized)
        ids = [part.cpu().numpy() for part in self.example_ids]
        return EvalResult(
            metrics=metrics,
            scores=self._scores_table(ids),
            representations=torch.cat(self.representations).cpu().numpy(),
            example_ids=np.concatenate(ids),
            outcomes_from=self._outcomes_table,
        )

    def _outcomes_table(self) -> pd.DataFrame:
        """The counted entries of every task with outcomes, task by task, batch-major."""
        frames = []
        for task, parts in self.outcomes.items():
            columns = {key: torch.cat([p[key] for p in parts]).cpu().numpy() for key in parts[0]}
            keep = columns.pop("keep").astype(bool)
            frame = pd.DataFrame({key: values[keep] for key, values in columns.items()})
            frames.append(frame.assign(task=task))
        if not frames:
            return pd.DataFrame(columns=OUTCOME_COLUMNS)
        return pd.concat(frames, ignore_index=True)[OUTCOME_COLUMNS]

    def _scores_table(self, ids: list[np.ndarray]) -> pd.DataFrame:
        """One row per (batch, task, example), batch-major (see the module docstring)."""
        names = np.array([task.name for task in self.tasks], dtype=object)
        sizes = np.repeat([len(part) for part in ids], len(names))
        codes = np.repeat(np.tile(np.arange(len(names)), len(ids)), sizes)
        return pd.DataFrame(
            {
                "task": names[codes],
                "example_id": np.concatenate([part for part in ids for _ in names]),
                "score": torch.cat(self.scores).cpu().numpy(),
                "valid": torch.cat(self.valid).cpu().numpy().astype(bool),
            }
        )
