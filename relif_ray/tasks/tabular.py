"""The tasks of a table (`relif_ray.data.tabular`): binary, multiclass and regression.

Every target is (B, 2) = (mask, value): a missing label masks its task for that row only.

* binary: one logit per row; the clinical binary task (`relif_ray.tasks.clinical`): masked
  binary cross-entropy, AUROC and trapezoid AUPRC of the logits, normalized score AUROC, audit
  score the positive-class probability.
* multiclass: C logits per row; masked cross-entropy; macro AUROC (one class against the rest,
  averaged over the classes present in both roles, as scikit-learn's
  `roc_auc_score(multi_class="ovr", average="macro")` where every class is present) and
  accuracy of the arg-max; normalized score macro AUROC; audit score the predicted class's
  probability (the max softmax, as NYUv2's segmentation).
* regression: one number per row, predicting the label standardised with the training split's
  mean and std (the loss is the masked mean squared error in those units); MAE and RMSE in the
  column's own units; normalized score 1 / (1 + RMSE / std), NYUv2 depth's 1 / (1 + RMSE) in
  units of the training labels' spread so that it does not depend on the column's unit. Its
  audit score is the standardised prediction itself, unbounded like NYUv2's depth and normal
  scores, so `score_is_probability = False`: the audit squashes it with the same-seed ERM
  reference quantiles (`relif_ray.squash`), in training (ReLiF) and at analysis time alike.

Every task stores its per-row outcomes for the group audit (`Task.outcome_kind`): binary the
label and logit, multiclass the class and the arg-max class, regression the label and the
prediction in the column's units.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from relif_ray.tasks.base import (
    Batch,
    MetricAccumulator,
    ModelOutput,
    Outcomes,
    Task,
    masked_mean,
)
from relif_ray.tasks.clinical import Collector, MortalityTask, macro_auroc


class BinaryTask(MortalityTask):
    """A binary column: one logit per row, (B,); the clinical binary task under its own name."""


class MulticlassMetrics(MetricAccumulator):
    """Macro one-vs-rest AUROC of the class probabilities and accuracy of the arg-max."""

    higher_is_better: ClassVar[Mapping[str, bool]] = {"auroc_macro": True, "accuracy": True}

    def __init__(self) -> None:
        self.collected = Collector()

    def update(self, prediction: Tensor, target: Tensor) -> None:
        probabilities = torch.softmax(prediction.double(), dim=-1)
        self.collected.add(target[:, 0] > 0.5, probabilities=probabilities, labels=target[:, 1])

    def compute(self) -> dict[str, float]:
        labels = self.collected.get("labels").astype(np.int64)
        if labels.size == 0:
            return {"auroc_macro": float("nan"), "accuracy": float("nan")}
        probabilities = self.collected.get("probabilities").reshape(labels.size, -1)
        per_class = (
            (probabilities[:, k], (labels == k).astype(np.int64))
            for k in range(probabilities.shape[1])
        )
        return {
            "auroc_macro": macro_auroc(per_class),
            "accuracy": float(np.mean(probabilities.argmax(axis=1) == labels)),
        }


class MulticlassTask(Task):
    """A multiclass column: `num_classes` logits per row, (B, C)."""

    outcome_kind = "multiclass"

    def __init__(self, name: str, num_classes: int) -> None:
        self.name = name
        self.num_classes = num_classes

    def loss(self, prediction: Tensor, target: Tensor) -> Tensor:
        mask = target[:, 0]
        classes = (target[:, 1] * mask).long()  # a masked row's class is 0, and left out
        return masked_mean(F.cross_entropy(prediction, classes, reduction="none"), mask)

    def new_metrics(self) -> MetricAccumulator:
        return MulticlassMetrics()

    def normalized_score(self, metrics: dict[str, float]) -> float:
        return metrics["auroc_macro"]

    def audit_score(self, output: ModelOutput, batch: Batch) -> tuple[Tensor, Tensor]:
        confidence = torch.softmax(output.predictions[self.name], dim=-1).amax(dim=-1)
        return confidence, batch[self.name][:, 0] > 0.5

    def outcomes(self, prediction: Tensor, target: Tensor) -> Outcomes:
        """The class and the arg-max class of every labelled row."""
        predicted = prediction.argmax(dim=-1).to(target.dtype)
        return Outcomes(target[:, 1:2], predicted[:, None], target[:, 0:1] > 0.5)


class RegressionMetrics(MetricAccumulator):
    """MAE and RMSE in the column's units (predictions mapped back with the training mean and
    std)."""

    higher_is_better: ClassVar[Mapping[str, bool]] = {"mae": False, "rmse": False}

    def __init__(self, mean: float, std: float) -> None:
        self.mean, self.std = mean, std
        self.collected = Collector()

    def update(self, prediction: Tensor, target: Tensor) -> None:
        self.collected.add(target[:, 0] > 0.5, predictions=prediction, labels=target[:, 1])

    def compute(self) -> dict[str, float]:
        labels = self.collected.get("labels")
        if labels.size == 0:
            return {"mae": float("nan"), "rmse": float("nan")}
        errors = self.collected.get("predictions") * self.std + self.mean - labels
        return {"mae": float(np.mean(np.abs(errors))), "rmse": float(np.sqrt(np.mean(errors**2)))}


class RegressionTask(Task):
    """A numeric column: one number per row, (B,), in standardised units (module docstring).

    mean, std: the training split's labels' (1 and 0 where only the declarations are needed)."""

    score_is_probability = False
    outcome_kind = "regression"

    def __init__(self, name: str, mean: float = 0.0, std: float = 1.0) -> None:
        self.name = name
        self.mean, self.std = mean, std

    def loss(self, prediction: Tensor, target: Tensor) -> Tensor:
        standardised = (target[:, 1] - self.mean) / self.std
        return masked_mean((prediction - standardised) ** 2, target[:, 0])

    def new_metrics(self) -> MetricAccumulator:
        return RegressionMetrics(self.mean, self.std)

    def normalized_score(self, metrics: dict[str, float]) -> float:
        return 1.0 / (1.0 + metrics["rmse"] / self.std)

    def audit_score(self, output: ModelOutput, batch: Batch) -> tuple[Tensor, Tensor]:
        return output.predictions[self.name], batch[self.name][:, 0] > 0.5

    def outcomes(self, prediction: Tensor, target: Tensor) -> Outcomes:
        """The label and the prediction of every labelled row, in the column's units."""
        predicted = prediction.to(target.dtype) * self.std + self.mean
        return Outcomes(target[:, 1:2], predicted[:, None], target[:, 0:1] > 0.5)
