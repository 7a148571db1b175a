"""NYUv2 tasks: 13-class segmentation, depth and surface normals.

Losses follow LibMTL/MTAN (cross-entropy with ignore -1, masked L1 depth, 1 - cosine on valid
normals). Metrics follow DESIGN.md's conventions: one confusion matrix per split, pooled depth
errors over all valid pixels, normal angles in degrees. Normalized scores (checked against
the paper's Table 1): seg = mIoU, depth = 1/(1+RMSE), normal = 1 - mean_angle/180.

Audit scores p_k (paper appendix "Confidence computation"): seg = valid-region mean of the
per-pixel max softmax; depth and normal = valid-region mean of the channel-wise L2 norm of the
head's decoder feature map. The latter are RAW (unbounded): the shared squash with same-seed
ERM validation quantiles is applied at analysis time, hence `score_is_probability = False`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from relif_ray.tasks.base import (
    Batch,
    MetricAccumulator,
    ModelOutput,
    Task,
    accumulate,
    count_bins,
    masked_mean,
    masked_mean_per_example,
)

NUM_CLASSES = 13
ANGLE_BINS_PER_DEGREE = 100
"""Normal-angle histogram resolution; the median is exact to 1/100 degree."""


def _feature_norm_score(features: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Valid-region mean of the channel-wise L2 norm of a decoder feature map."""
    norm = torch.linalg.vector_norm(features, dim=1, keepdim=True)
    norm = F.interpolate(norm, size=valid.shape[-2:], mode="bilinear", align_corners=False)
    return masked_mean_per_example(norm[:, 0], valid)


class SegmentationTask(Task):
    name = "seg"

    def loss(self, prediction: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(prediction, target.long(), ignore_index=-1)

    def new_metrics(self) -> MetricAccumulator:
        return SegmentationMetrics()

    def normalized_score(self, metrics: dict[str, float]) -> float:
        return metrics["miou"]

    def audit_score(self, output: ModelOutput, batch: Batch) -> tuple[Tensor, Tensor]:
        confidence = output.predictions[self.name].softmax(dim=1).amax(dim=1)
        return masked_mean_per_example(confidence, batch[self.name] >= 0)


class DepthTask(Task):
    name = "depth"
    score_is_probability = False

    def loss(self, prediction: Tensor, target: Tensor) -> Tensor:
        return masked_mean((prediction - target).abs(), target > 0)

    def new_metrics(self) -> MetricAccumulator:
        return DepthMetrics()

    def normalized_score(self, metrics: dict[str, float]) -> float:
        return 1.0 / (1.0 + metrics["rmse"])

    def audit_score(self, output: ModelOutput, batch: Batch) -> tuple[Tensor, Tensor]:
        return _feature_norm_score(output.features[self.name], batch[self.name][:, 0] > 0)


class NormalTask(Task):
    name = "normal"
    score_is_probability = False

    def loss(self, prediction: Tensor, target: Tensor) -> Tensor:
        valid = target.abs().sum(dim=1) > 0
        cosine = (F.normalize(prediction, dim=1) * target).sum(dim=1)
        return masked_mean(1.0 - cosine, valid)

    def new_metrics(self) -> MetricAccumulator:
        return NormalMetrics()

    def normalized_score(self, metrics: dict[str, float]) -> float:
        return 1.0 - metrics["angle_mean"] / 180.0

    def audit_score(self, output: ModelOutput, batch: Batch) -> tuple[Tensor, Tensor]:
        valid = batch[self.name].abs().sum(dim=1) > 0
        return _feature_norm_score(output.features[self.name], valid)


def nyuv2_tasks() -> list[Task]:
    return [SegmentationTask(), DepthTask(), NormalTask()]


class SegmentationMetrics(MetricAccumulator):
    """mIoU and pixel accuracy from one confusion matrix accumulated over the split.

    Classes with an empty union (absent from predictions and targets) are skipped in the mean,
    where LibMTL's code would return NaN. Ignored pixels (label -1) are left out by
    `count_bins`'s mask, so no pixel is selected on the host.
    """

    higher_is_better: ClassVar[Mapping[str, bool]] = {"miou": True, "pixel_acc": True}

    def __init__(self) -> None:
        self.confusion: Tensor | None = None
        """(true class, predicted class) -> pixels, int64, on the predictions' device."""

    def update(self, prediction: Tensor, target: Tensor) -> None:
        predicted = prediction.argmax(dim=1).flatten()
        target = target.flatten().long()
        index = target * NUM_CLASSES + predicted
        counts = count_bins(index, NUM_CLASSES**2, keep=target >= 0).view(NUM_CLASSES, -1)
        self.confusion = accumulate(self.confusion, counts)

    def compute(self) -> dict[str, float]:
        empty = torch.zeros(NUM_CLASSES, NUM_CLASSES)
        confusion = empty if self.confusion is None else self.confusion.cpu().double()
        true_positive = confusion.diag()
        union = confusion.sum(0) + confusion.sum(1) - true_positive
        present = union > 0
        iou = true_positive[present] / union[present]
        total = confusion.sum()
        return {
            "miou": float(iou.mean()) if present.any() else float("nan"),
            "pixel_acc": float(true_positive.sum() / total) if total > 0 else float("nan"),
        }


class DepthMetrics(MetricAccumulator):
    """Absolute error, relative error |p-g|/g and RMSE pooled over all valid pixels (float64
    sums of the float32 errors; invalid pixels add zeros)."""

    higher_is_better: ClassVar[Mapping[str, bool]] = {
        "abs_err": False,
        "rel_err": False,
        "rmse": False,
    }

    def __init__(self) -> None:
        self.sums: Tensor | None = None
        """Sums of |error|, |error| / ground truth and error^2 over valid pixels, float64."""
        self.count: Tensor | None = None

    def update(self, prediction: Tensor, target: Tensor) -> None:
        valid = target > 0
        error = (prediction - target).double().abs()
        ground = torch.where(valid, target.double(), 1.0)
        terms = torch.stack([error, error / ground, error.pow(2)])
        self.sums = accumulate(self.sums, torch.where(valid, terms, 0.0).flatten(1).sum(1))
        self.count = accumulate(self.count, valid.sum())

    def compute(self) -> dict[str, float]:
        """NaN errors (hence a NaN normalized score) when the split has no valid pixel, like
        an undefined mIoU: no prediction was checked, so there is no error to report."""
        count = 0 if self.count is None else int(self.count)
        if count == 0:
            return dict.fromkeys(("abs_err", "rel_err", "rmse"), math.nan)
        abs_err, rel_err, sq_err = (self.sums.cpu() / count).tolist()
        return {"abs_err": abs_err, "rel_err": rel_err, "rmse": math.sqrt(sq_err)}


class NormalMetrics(MetricAccumulator):
    """Angle (degrees) between the normalized prediction and the target on valid pixels.

    Mean and the fractions strictly below 11.25/22.5/30 degrees are exact; the median comes
    from a histogram with `ANGLE_BINS_PER_DEGREE` bins per degree (exact to 0.01 degree), so a
    whole split never has to be held in memory. Invalid pixels are left out of the histogram by
    `count_bins`'s mask and add zeros to the sums.
    """

    THRESHOLDS = (11.25, 22.5, 30.0)
    higher_is_better: ClassVar[Mapping[str, bool]] = {
        "angle_mean": False,
        "angle_median": False,
        **{f"within_{threshold:g}": True for threshold in THRESHOLDS},
    }

    BINS = 180 * ANGLE_BINS_PER_DEGREE + 1

    def __init__(self) -> None:
        self.histogram: Tensor | None = None
        self.angle_sum: Tensor | None = None
        self.below: Tensor | None = None
        """Valid pixels strictly below each of `THRESHOLDS`."""
        self.count: Tensor | None = None

    def update(self, prediction: Tensor, target: Tensor) -> None:
        valid = target.abs().sum(dim=1) > 0
        cosine = (F.normalize(prediction, dim=1) * target).sum(dim=1)
        angle = torch.rad2deg(torch.acos(cosine.double().clamp(-1.0, 1.0)))
        index = (angle * ANGLE_BINS_PER_DEGREE).floor().long().clamp(0, self.BINS - 1)
        counts = count_bins(index, self.BINS, keep=valid)
        below = torch.stack([((angle < limit) & valid).sum() for limit in self.THRESHOLDS])
        self.histogram = accumulate(self.histogram, counts)
        self.angle_sum = accumulate(self.angle_sum, torch.where(valid, angle, 0.0).sum())
        self.below = accumulate(self.below, below)
        self.count = accumulate(self.count, valid.sum())

    def compute(self) -> dict[str, float]:
        """NaN for every metric when the split has no valid pixel (see `DepthMetrics`)."""
        count = 0 if self.count is None else int(self.count)
        if count == 0:
            names = ["angle_mean", "angle_median", *(f"within_{t:g}" for t in self.THRESHOLDS)]
            return dict.fromkeys(names, math.nan)
        cumulative = self.histogram.cpu().cumsum(0)
        # Like numpy: the mean of the lower and upper middle values (equal for odd counts).
        middle = torch.tensor([(count + 1) // 2, count // 2 + 1])
        median_bins = torch.searchsorted(cumulative, middle).double() + 0.5
        result = {
            "angle_mean": float(self.angle_sum) / count,
            "angle_median": float(median_bins.mean()) / ANGLE_BINS_PER_DEGREE,
        }
        for threshold, below in zip(self.THRESHOLDS, self.below.tolist(), strict=True):
            result[f"within_{threshold:g}"] = below / count
        return result
