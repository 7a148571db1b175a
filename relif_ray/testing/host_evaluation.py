"""The host-side evaluation that the device path replaced, kept as the reference the device
path is checked against (`tests/test_evaluation.py`) and as the "before" of
the benchmarks' `breakdown` suite.

Per batch it copies ids, representations, scores and validity to the host and builds a pandas
frame per task; its metric accumulators copy predictions and targets to the host and select
the valid entries with boolean masks there. The accumulators are the library's own with the
update they had then: their sums and counts (the same attributes) are compared with the device
path's, and `compute` turns them into the metrics.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from relif_ray.engine import TrainingRun
from relif_ray.evaluation import EvalResult
from relif_ray.tasks import clinical, nyuv2
from relif_ray.tasks.base import MetricAccumulator, worst_and_macro


class HostSegmentation(nyuv2.SegmentationMetrics):
    def update(self, prediction: Tensor, target: Tensor) -> None:
        classes = nyuv2.NUM_CLASSES
        predicted = prediction.argmax(dim=1).flatten().cpu()
        target = target.flatten().cpu().long()
        keep = target >= 0
        index = target[keep] * classes + predicted[keep]
        counts = torch.bincount(index, minlength=classes**2).view(classes, classes)
        self.confusion = counts if self.confusion is None else self.confusion + counts


class HostDepth(nyuv2.DepthMetrics):
    def update(self, prediction: Tensor, target: Tensor) -> None:
        valid = target > 0
        error = (prediction - target)[valid].double().cpu()
        ground = target[valid].double().cpu()
        sums = torch.stack([error.abs().sum(), (error.abs() / ground).sum(), error.pow(2).sum()])
        self.sums = sums if self.sums is None else self.sums + sums
        self.count = int(valid.sum()) + (0 if self.count is None else self.count)


class HostNormal(nyuv2.NormalMetrics):
    def update(self, prediction: Tensor, target: Tensor) -> None:
        valid = target.abs().sum(dim=1) > 0
        cosine = (F.normalize(prediction, dim=1) * target).sum(dim=1)[valid]
        angle = torch.rad2deg(torch.acos(cosine.double().clamp(-1.0, 1.0))).cpu()
        below = torch.stack([(angle < t).sum() for t in self.THRESHOLDS])
        bins = (angle * nyuv2.ANGLE_BINS_PER_DEGREE).floor().long().clamp_max(self.BINS - 1)
        histogram = torch.bincount(bins, minlength=self.BINS)
        first = self.count is None
        self.histogram = histogram if first else self.histogram + histogram
        self.angle_sum = float(angle.sum()) + (0.0 if first else self.angle_sum)
        self.below = below if first else self.below + below
        self.count = int(angle.numel()) + (0 if first else self.count)


class HostCollector:
    """The clinical accumulators' entries, selected with boolean masks on the host."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {}

    def add(self, **values: Tensor) -> None:
        for key, value in values.items():
            self.parts.setdefault(key, []).append(value.detach().cpu().double().numpy())

    def get(self, key: str) -> np.ndarray:
        return np.concatenate(self.parts.get(key, [np.zeros((0,))]))


class HostBinary(clinical.BinaryMetrics):
    def __init__(self) -> None:
        self.collected = HostCollector()

    def update(self, prediction: Tensor, target: Tensor) -> None:
        labelled = target[..., 0] > 0.5
        self.collected.add(logits=prediction[labelled], labels=target[..., 1][labelled])


class HostPhenotype(clinical.PhenotypeMetrics):
    def __init__(self) -> None:
        self.collected = HostCollector()

    def update(self, prediction: Tensor, target: Tensor) -> None:
        self.collected.add(logits=prediction, labels=target)


class HostLengthOfStay(clinical.LengthOfStayMetrics):
    def __init__(self) -> None:
        self.collected = HostCollector()

    def update(self, prediction: Tensor, target: Tensor) -> None:
        labelled = target[..., 0] > 0.5
        self.collected.add(
            predicted_bins=prediction[labelled].argmax(dim=-1), hours=target[..., 1][labelled]
        )


HOST_UPDATES: dict[type, type] = {
    nyuv2.SegmentationMetrics: HostSegmentation,
    nyuv2.DepthMetrics: HostDepth,
    nyuv2.NormalMetrics: HostNormal,
    clinical.BinaryMetrics: HostBinary,
    clinical.PhenotypeMetrics: HostPhenotype,
    clinical.LengthOfStayMetrics: HostLengthOfStay,
}
"""Each device accumulator -> the same accumulator with the host update it replaced."""


@torch.inference_mode()
def host_evaluate(
    run: TrainingRun, split_name: str = "val"
) -> tuple[EvalResult, dict[str, MetricAccumulator]]:
    """The evaluation as it was (the host split, per-batch host copies, a frame per batch and
    task) of `run`'s model; its result and its accumulators by task."""
    split = run.problem.splits[split_name]
    run.model.eval()
    accumulators: dict[str, MetricAccumulator] = {
        task.name: HOST_UPDATES[type(task.new_metrics())]() for task in run.tasks
    }
    score_parts, representations, example_ids = [], [], []
    size = run.config.train.eval_batch_size
    for start in range(0, len(split), size):
        batch = run._to_device(split.batch(torch.arange(start, min(start + size, len(split)))))
        output = run._forward(batch)
        ids = batch["example_id"].cpu().numpy()
        example_ids.append(ids)
        representations.append(output.representation.float().cpu().numpy())
        for task in run.tasks:
            accumulators[task.name].update(output.predictions[task.name], batch[task.name])
            score, valid = task.audit_score(output, batch)
            frame = {"task": task.name, "example_id": ids, "score": score.float().cpu().numpy()}
            score_parts.append(pd.DataFrame({**frame, "valid": valid.cpu().numpy()}))
    metrics, normalized = {}, {}
    for task in run.tasks:
        native = accumulators[task.name].compute()
        metrics.update({f"{task.name}_{key}": value for key, value in native.items()})
        normalized[task.name] = task.normalized_score(native)
        metrics[f"{task.name}_score"] = normalized[task.name]
    metrics["worst"], metrics["macro"] = worst_and_macro(normalized)
    result = EvalResult(
        metrics=metrics,
        scores=pd.concat(score_parts, ignore_index=True),
        representations=np.concatenate(representations),
        example_ids=np.concatenate(example_ids),
    )
    return result, accumulators
