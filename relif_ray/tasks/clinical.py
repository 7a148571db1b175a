"""Clinical tasks of the Harutyunyan et al. (2019) multitask benchmark (MIMIC-III) and eICU.

Targets carry their own masks, because the benchmark labels only some stays and steps:

* mortality: (B, 2) = (mask, label); mask = 1 for stays of at least 48 hours with data in
  the first 48 hours (the benchmark's in-hospital-mortality mask);
* decompensation: (B, T, 2) = (mask, label) per hourly step;
* length_of_stay: (B, T, 2) = (mask, remaining length of stay in hours) per hourly step;
* phenotype: (B, 25) labels, every stay labelled.

Metrics follow the benchmark's `mimic3models/metrics.py`:

* AUROC: the area under the ROC curve (equal to sklearn's `roc_auc_score`, ties averaged).
  AUROC and AUPRC depend only on the order of the scores, and the sigmoid is monotone, so both
  rank the float64 LOGITS: a float32 sigmoid rounds every logit above about 17 to exactly 1.0
  and would turn distinct predictions into ties.
* AUPRC: the TRAPEZOID area under the precision-recall curve, i.e. sklearn's
  `auc(recall, precision)` on `precision_recall_curve` - what the benchmark reports. It is not
  average precision (sklearn's `average_precision_score`, a step-wise sum); the two differ,
  most when scores tie.
* Phenotype: macro AUROC = the mean of the per-label AUROCs (labels whose split lacks one of
  the two classes have no AUROC and are left out of the mean).
* Length of stay: the remaining stay in hours falls into 10 bins, half-open in days
  [0,1), [1,2), ..., [7,8), [8,14), [14, inf) (the benchmark's CustomBins); the predicted bin is
  the arg-max of the 10 logits. Cohen's kappa with linear weights compares true and predicted
  bins over the bins that occur in either (sklearn's `cohen_kappa_score(weights="linear")`, as
  the benchmark calls it). MAD is the mean absolute difference, in hours, between the true
  remaining stay and the benchmark's mean of the predicted bin (`LOS_BIN_MEAN_HOURS`).

Normalized higher-is-better scores (for Worst = min and Macro = mean over tasks): the paper
does not define them for the clinical tasks, so we choose: AUROC for mortality and
decompensation, macro AUROC for phenotype, and (kappa + 1) / 2 for length of stay (kappa lies
in [-1, 1]; the map is monotone and sends chance agreement to 0.5 like an AUROC). A metric
that is undefined on a split (one class only) is NaN, and so is its normalized score.

Audit scores p_k(x) in [0, 1] (paper appendix "Confidence computation", DESIGN.md): mortality
sigmoid; decompensation mean sigmoid over the stay's labelled steps; length of stay max softmax
over the 10 bins, averaged over the labelled steps the same way (the paper does not say how
the per-step confidences of this per-step task are pooled); phenotype max sigmoid over the 25
labels. A stay is valid for a task's audit when the task labels it (mask, or any labelled step).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
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
    masked_mean_per_example,
)

LOS_BIN_EDGES_HOURS = (24.0, 48.0, 72.0, 96.0, 120.0, 144.0, 168.0, 192.0, 336.0)
"""Upper edges of the first nine length-of-stay bins (hours); the tenth bin is [336, inf)."""

LOS_BIN_MEAN_HOURS = (
    11.450379, 35.070846, 59.206531, 83.382723, 107.487817,
    131.579534, 155.643957, 179.660558, 254.306624, 585.325890,
)  # fmt: skip
"""Mean remaining stay (hours) of each bin in the MIMIC-III benchmark (CustomBins.means)."""

NUM_LOS_BINS = 10


def los_bins(hours: Tensor) -> Tensor:
    """Bin index (long) of remaining stays in hours: bin i holds edges[i-1] <= h < edges[i],
    i.e. the number of edges <= h: one comparison with the edges held on the device once per
    process (not copied, and waited for, every training step; nor counted edge by edge, nine
    comparisons and additions per step) and one sum."""
    return (hours.unsqueeze(-1) >= _los_edges(hours.dtype, hours.device)).sum(-1)


@functools.cache
def _los_edges(dtype: torch.dtype, device: torch.device) -> Tensor:
    with torch.inference_mode(False):  # usable in training even if first made in evaluation
        return torch.tensor(LOS_BIN_EDGES_HOURS, dtype=dtype, device=device)


# ----------------------------------------------------------------------------------------
# Metrics (numpy, float64), checked against scikit-learn in the tests.


def binary_auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve via the Mann-Whitney statistic (ties count one half)."""
    positives = labels == 1
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    # deferred: scipy.stats takes 0.4 s to import, paid by every process that loads the
    # problem registry (sweep drivers, `relif` commands) whether or not it scores a stay
    from scipy.stats import rankdata

    ranks = rankdata(scores)
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def auprc_trapezoid(scores: np.ndarray, labels: np.ndarray) -> float:
    """Trapezoid area under the precision-recall curve, one point per distinct score.

    The curve starts at (recall 0, precision 1) and visits, for every distinct score taken as
    a threshold (highest first), the recall and precision of "score >= threshold".
    """
    if not (labels == 1).any():
        return float("nan")
    order = np.argsort(-scores, kind="mergesort")
    sorted_scores, sorted_labels = scores[order], labels[order]
    last_of_each_score = np.r_[np.flatnonzero(np.diff(sorted_scores)), len(scores) - 1]
    true_pos = np.cumsum(sorted_labels)[last_of_each_score]
    predicted_pos = last_of_each_score + 1
    recall = np.r_[0.0, true_pos / true_pos[-1]]
    precision = np.r_[1.0, true_pos / predicted_pos]
    return float(np.sum(np.diff(recall) * (precision[1:] + precision[:-1]) / 2))


def macro_auroc(per_label: Iterable[tuple[np.ndarray, np.ndarray]]) -> float:
    """The mean of the per-label AUROCs (`binary_auroc` of each label's (scores, labels)) over
    the labels with both classes; NaN where none has."""
    values = [binary_auroc(scores, labels) for scores, labels in per_label]
    defined = [value for value in values if not np.isnan(value)]
    return float(np.mean(defined)) if defined else float("nan")


def linear_weighted_kappa(true_bins: np.ndarray, predicted_bins: np.ndarray) -> float:
    """Cohen's kappa with weights |i - j| over the bins present in either array."""
    present = np.union1d(true_bins, predicted_bins)
    rows = np.searchsorted(present, true_bins)
    cols = np.searchsorted(present, predicted_bins)
    k = len(present)
    observed = np.zeros((k, k))
    np.add.at(observed, (rows, cols), 1.0)
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0)) / observed.sum()
    weights = np.abs(np.arange(k)[:, None] - np.arange(k)[None, :])
    disagreement = (weights * expected).sum()
    if disagreement == 0:
        return float("nan")
    return float(1.0 - (weights * observed).sum() / disagreement)


class Collector:
    """Every batch's values of a whole-split computation, kept where they are (on the device)
    as flat tensors with the mask of the entries that count, and copied to the host once:
    `get` selects the counted entries there, so no mask is applied on the device."""

    def __init__(self) -> None:
        self.parts: dict[str, list[Tensor]] = {}

    def add(self, keep: Tensor, **values: Tensor) -> None:
        """`values` of one batch (each of `keep`'s shape, or with one more trailing dimension)
        and `keep`, which of their entries count."""
        for key, value in {**values, "keep": keep}.items():
            flat = value.detach().reshape(keep.numel(), -1).squeeze(-1)
            self.parts.setdefault(key, []).append(flat)

    def get(self, key: str) -> np.ndarray:
        """The counted entries of `key` over the split, in float64."""
        if key not in self.parts:
            return np.zeros((0,))
        keep = torch.cat(self.parts["keep"]).cpu().numpy().astype(bool)
        return torch.cat(self.parts[key]).cpu().double().numpy()[keep]


class BinaryMetrics(MetricAccumulator):
    """AUROC and trapezoid AUPRC over every labelled stay (or step) of a split."""

    higher_is_better: ClassVar[Mapping[str, bool]] = {"auroc": True, "auprc": True}

    def __init__(self) -> None:
        self.collected = Collector()

    def update(self, prediction: Tensor, target: Tensor) -> None:
        labelled = target[..., 0] > 0.5
        self.collected.add(labelled, logits=prediction, labels=target[..., 1])

    def compute(self) -> dict[str, float]:
        logits, labels = self.collected.get("logits"), self.collected.get("labels")
        return {"auroc": binary_auroc(logits, labels), "auprc": auprc_trapezoid(logits, labels)}


class PhenotypeMetrics(MetricAccumulator):
    """Macro AUROC over the 25 phenotype labels."""

    higher_is_better: ClassVar[Mapping[str, bool]] = {"auroc_macro": True}

    def __init__(self) -> None:
        self.collected = Collector()

    def update(self, prediction: Tensor, target: Tensor) -> None:
        every_stay = torch.ones_like(prediction[:, 0], dtype=torch.bool)
        self.collected.add(every_stay, logits=prediction, labels=target)

    def compute(self) -> dict[str, float]:
        logits, labels = self.collected.get("logits"), self.collected.get("labels")
        if logits.size == 0:
            return {"auroc_macro": float("nan")}
        per_label = ((logits[:, k], labels[:, k]) for k in range(labels.shape[1]))
        return {"auroc_macro": macro_auroc(per_label)}


class LengthOfStayMetrics(MetricAccumulator):
    """Linear-weighted kappa over the 10 bins and MAD (hours) against the bin means."""

    higher_is_better: ClassVar[Mapping[str, bool]] = {"kappa": True, "mad": False}

    def __init__(self) -> None:
        self.collected = Collector()

    def update(self, prediction: Tensor, target: Tensor) -> None:
        labelled = target[..., 0] > 0.5
        predicted_bins = prediction.argmax(dim=-1)
        self.collected.add(labelled, predicted_bins=predicted_bins, hours=target[..., 1])

    def compute(self) -> dict[str, float]:
        predicted = self.collected.get("predicted_bins").astype(np.int64)
        hours = self.collected.get("hours")
        if hours.size == 0:
            return {"kappa": float("nan"), "mad": float("nan")}
        true_bins = np.searchsorted(np.array(LOS_BIN_EDGES_HOURS), hours, side="right")
        estimates = np.array(LOS_BIN_MEAN_HOURS)[predicted]
        return {
            "kappa": linear_weighted_kappa(true_bins, predicted),
            "mad": float(np.mean(np.abs(hours - estimates))),
        }


# ----------------------------------------------------------------------------------------
# Tasks


class MortalityTask(Task):
    """In-hospital mortality from the first 48 hours: one logit per stay, (B,)."""

    outcome_kind = "binary"

    def __init__(self, name: str = "mortality") -> None:
        self.name = name

    def loss(self, prediction: Tensor, target: Tensor) -> Tensor:
        bce = F.binary_cross_entropy_with_logits(prediction, target[:, 1], reduction="none")
        return masked_mean(bce, target[:, 0])

    def new_metrics(self) -> MetricAccumulator:
        return BinaryMetrics()

    def normalized_score(self, metrics: dict[str, float]) -> float:
        return metrics["auroc"]

    def audit_score(self, output: ModelOutput, batch: Batch) -> tuple[Tensor, Tensor]:
        target = batch[self.name]
        return torch.sigmoid(output.predictions[self.name]), target[:, 0] > 0.5

    def outcomes(self, prediction: Tensor, target: Tensor) -> Outcomes:
        """The label and logit of every labelled stay."""
        return Outcomes(target[:, 1:2], prediction[:, None], target[:, 0:1] > 0.5)


class DecompensationTask(Task):
    """Death within the next 24 hours, at every hourly step: logits (B, T)."""

    outcome_kind = "binary"

    def __init__(self, name: str = "decompensation") -> None:
        self.name = name

    def loss(self, prediction: Tensor, target: Tensor) -> Tensor:
        bce = F.binary_cross_entropy_with_logits(prediction, target[..., 1], reduction="none")
        return masked_mean(bce, target[..., 0])

    def new_metrics(self) -> MetricAccumulator:
        return BinaryMetrics()

    def normalized_score(self, metrics: dict[str, float]) -> float:
        return metrics["auroc"]

    def audit_score(self, output: ModelOutput, batch: Batch) -> tuple[Tensor, Tensor]:
        mask = batch[self.name][..., 0]
        probabilities = torch.sigmoid(output.predictions[self.name])
        return masked_mean_per_example(probabilities, mask)

    def outcomes(self, prediction: Tensor, target: Tensor) -> Outcomes:
        """The label and logit of every labelled step (the steps the metric pools)."""
        return Outcomes(target[..., 1], prediction, target[..., 0] > 0.5)


class LengthOfStayTask(Task):
    """Remaining length of stay in 10 bins, at every hourly step: logits (B, T, 10)."""

    outcome_kind = "length_of_stay"

    def __init__(self, name: str = "length_of_stay") -> None:
        self.name = name

    def loss(self, prediction: Tensor, target: Tensor) -> Tensor:
        bins = los_bins(target[..., 1])
        cross_entropy = F.cross_entropy(prediction.transpose(1, -1), bins, reduction="none")
        return masked_mean(cross_entropy, target[..., 0])

    def new_metrics(self) -> MetricAccumulator:
        return LengthOfStayMetrics()

    def normalized_score(self, metrics: dict[str, float]) -> float:
        return (metrics["kappa"] + 1.0) / 2.0

    def audit_score(self, output: ModelOutput, batch: Batch) -> tuple[Tensor, Tensor]:
        mask = batch[self.name][..., 0]
        confidence = torch.softmax(output.predictions[self.name], dim=-1).amax(dim=-1)
        return masked_mean_per_example(confidence, mask)

    def outcomes(self, prediction: Tensor, target: Tensor) -> Outcomes:
        """The remaining hours and the predicted (arg-max) bin of every labelled step: what
        kappa and MAD compare."""
        return Outcomes(target[..., 1], prediction.argmax(dim=-1), target[..., 0] > 0.5)


class PhenotypeTask(Task):
    """25 acute-care phenotypes of the stay (multi-label): logits (B, 25)."""

    outcome_kind = "multilabel"

    def __init__(self, name: str = "phenotype") -> None:
        self.name = name

    def loss(self, prediction: Tensor, target: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(prediction, target)

    def new_metrics(self) -> MetricAccumulator:
        return PhenotypeMetrics()

    def normalized_score(self, metrics: dict[str, float]) -> float:
        return metrics["auroc_macro"]

    def audit_score(self, output: ModelOutput, batch: Batch) -> tuple[Tensor, Tensor]:
        probabilities = torch.sigmoid(output.predictions[self.name])
        valid = torch.ones(probabilities.shape[0], dtype=torch.bool, device=probabilities.device)
        return probabilities.amax(dim=-1), valid

    def outcomes(self, prediction: Tensor, target: Tensor) -> Outcomes:
        """The 25 labels and logits of every stay."""
        return Outcomes(target, prediction, torch.ones_like(target, dtype=torch.bool))
