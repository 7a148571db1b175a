"""The task interface shared by every data set (NYUv2, MIMIC-III, eICU).

A task knows its loss, its native utility metrics, its normalized higher-is-better score
(used for Worst = min and Macro = mean over tasks) and its scalar audit score p_k(x) of the
paper's audit-score interface (section 3.1, appendix "Confidence computation").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from relif_ray.data.splits import Batch


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of `values` where `mask` is set; 0 (still differentiable) where nothing is.

    A multiply-and-sum rather than boolean indexing (`values[mask].mean()`), whose output
    shape depends on the data and so makes the host wait for the device every step."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def masked_mean_per_example(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Per-example mean of `values` (B, ...) over `mask` (B, ...) (pixels of an image, steps
    of a stay), and whether the example has any masked-in entry; the audit scores' form."""
    mask = mask.to(values.dtype)
    count = mask.flatten(1).sum(1)
    total = (values * mask).flatten(1).sum(1)
    return total / count.clamp(min=1.0), count > 0


@dataclass
class ModelOutput:
    """What a multi-task model returns for one batch.

    predictions: task name -> head output (logits or regression maps).
    features: task name -> the head's decoder feature map, where an audit score needs it.
    representation: (B, D) shared representation (global average pool of the encoder map for
        the dense model, the last LSTM state for the clinical model; per architecture:
        `relif_ray.models.base`); ReLiF prototypes and the method-induced thresholds use it.
    encoder_output: the encoder output that every head consumes (the dense model's feature
        map, the clinical LSTM outputs), the tensor itself so that gradients can be taken
        with respect to it (`method.gradient_source: representation`); None if not exposed
        (an architecture whose tasks read different tensors has none).
    auxiliary_loss: a loss term of the architecture itself (DSelect-k's gate regularizer),
        added to the step's loss after the method's aggregation; None where there is none.
    """

    predictions: dict[str, Tensor]
    representation: Tensor
    features: dict[str, Tensor] = field(default_factory=dict)
    encoder_output: Tensor | None = None
    auxiliary_loss: Tensor | None = None


def accumulate(total: Tensor | None, value: Tensor) -> Tensor:
    """`total + value`; `value` itself for a split's first batch, so every running sum starts
    on the device of the values it adds up (no host-to-device copy of a zero)."""
    return value if total is None else total + value


def count_bins(index: Tensor, bins: int, keep: Tensor | None = None) -> Tensor:
    """How often each of 0..bins-1 occurs in `index` (int64, on its device): what
    `torch.bincount(index, minlength=bins)` gives for indices below `bins`, without its host
    synchronisation on CUDA, where it reads max(index) on the host to size its output.

    keep: where given (the shape of `index`), only the positions where it is True count; the
    others go to one extra bin that is left out, so no position is selected on the host."""
    if keep is not None:
        index = torch.where(keep, index, bins)
    index = index.flatten()
    counts = torch.zeros(bins + 1, dtype=torch.int64, device=index.device)
    return counts.index_add_(0, index, torch.ones_like(index))[:bins]


class MetricAccumulator(ABC):
    """Accumulates a task's native metrics over a whole split, batch by batch.

    `update` keeps its sums and counts on the device of the predictions and never reads a
    device value on the host (the evaluation loop, `relif_ray.evaluation`); `compute` copies
    them to the host once. `higher_is_better` declares each metric's direction, by the name
    `compute` gives it (as torchmetrics' `Metric.higher_is_better`, one per metric here):
    tables mark the best value with it.
    """

    higher_is_better: ClassVar[Mapping[str, bool]]

    @abstractmethod
    def update(self, prediction: Tensor, target: Tensor) -> None: ...

    @abstractmethod
    def compute(self) -> dict[str, float]: ...


OUTCOME_KINDS = ("binary", "multilabel", "length_of_stay", "multiclass", "regression")
"""How a task's stored outcomes (`Task.outcomes`) read, for the group-fairness audit
(`relif_ray.analysis.groups`): "binary" - label 0/1 and the logit of the positive class per labelled
stay or step; "multilabel" - the same per stay and label, `position` being the label's index;
"length_of_stay" - the remaining stay in hours and the arg-max bin per labelled step;
"multiclass" - the class index and the arg-max class per labelled row; "regression" - the
label and the prediction per labelled row, both in the column's units."""


@dataclass
class Outcomes:
    """A task's per-example outcomes on one batch, each (B, K): the label, the prediction the
    decision is made from, and which entries count (K: 1 for a per-stay label, the steps of a
    per-step task, the labels of a multi-label one). Kept on the device like the metrics."""

    label: Tensor
    prediction: Tensor
    keep: Tensor


class Task(ABC):
    """One task of a multi-task problem.

    score_is_probability: whether the raw audit score already lies in [0, 1]; a task whose
    score does not (NYUv2 depth/normal feature norms) is squashed by the audit's shared
    `relif_ray.squash.squash`, in training (ReLiF) and at analysis time alike.
    outcome_kind: one of `OUTCOME_KINDS` where the task stores its per-example outcomes
    (`outcomes`) for the group-fairness audit; None where it stores none (NYUv2's dense tasks:
    no patient groups to audit).
    """

    name: str
    score_is_probability: bool = True
    outcome_kind: str | None = None

    @abstractmethod
    def loss(self, prediction: Tensor, target: Tensor) -> Tensor:
        """Scalar training loss of this task on one batch."""

    @abstractmethod
    def new_metrics(self) -> MetricAccumulator:
        """A fresh accumulator of the native utility metrics."""

    @abstractmethod
    def normalized_score(self, metrics: dict[str, float]) -> float:
        """Higher-is-better score in [0, 1] from the native metrics (Worst/Macro use it)."""

    @abstractmethod
    def audit_score(self, output: ModelOutput, batch: Batch) -> tuple[Tensor, Tensor]:
        """Per-example raw audit score p_k(x) (differentiable) and a bool validity mask, (B,)."""

    def outcomes(self, prediction: Tensor, target: Tensor) -> Outcomes | None:
        """Labels and predictions per example of one batch, as `outcome_kind` says: what a
        group audit needs to recompute the task's metric and its decisions per patient group
        without the model. None (the default): the task stores no outcomes."""
        return None


def worst_and_macro(scores: dict[str, float]) -> tuple[float, float]:
    """Worst = min over tasks, Macro = mean over tasks of normalized scores."""
    values = torch.tensor(list(scores.values()), dtype=torch.float64)
    return float(values.min()), float(values.mean())
