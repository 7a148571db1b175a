"""NYUv2 losses, metrics (against torchmetrics / scikit-learn / numpy) and audit scores."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import accuracy_score
from torchmetrics.classification import MulticlassJaccardIndex

from relif_ray.tasks.base import ModelOutput, worst_and_macro
from relif_ray.tasks.nyuv2 import DepthTask, NormalTask, SegmentationTask

# The paper's Table 1: (Worst, Macro, seg mIoU, depth RMSE, normal mean angle) per method.
PAPER_TABLE_1 = {
    "ERM": (0.4790, 0.6382, 0.4790, 0.6634, 29.8199),
    "Uncertainty": (0.4810, 0.6395, 0.4810, 0.6609, 29.6318),
    "GradNorm": (0.4800, 0.6390, 0.4800, 0.6599, 29.7830),
    "PCGrad": (0.4721, 0.6329, 0.4721, 0.6812, 30.3050),
    "FairGrad": (0.4770, 0.6370, 0.4770, 0.6804, 28.9833),
    "CATS": (0.4781, 0.6375, 0.4781, 0.6594, 30.3028),
    "ReLiF": (0.4820, 0.6398, 0.4820, 0.6610, 29.6527),
}


@pytest.mark.parametrize("method", sorted(PAPER_TABLE_1))
def test_normalized_scores_reproduce_paper_table_1(method):
    worst, macro, miou, rmse, angle = PAPER_TABLE_1[method]
    scores = {
        "seg": SegmentationTask().normalized_score({"miou": miou}),
        "depth": DepthTask().normalized_score({"rmse": rmse}),
        "normal": NormalTask().normalized_score({"angle_mean": angle}),
    }
    got_worst, got_macro = worst_and_macro(scores)
    assert round(got_worst, 4) == worst
    assert abs(got_macro - macro) <= 1e-4


def _random_segmentation(seed: int):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 13, 9, 11, generator=generator)
    target = torch.randint(-1, 13, (3, 9, 11), generator=generator)
    target[target == 5] = 7  # class 5 absent from targets
    logits[:, 5] = -100.0  # ... and from predictions: skipped, not NaN
    return logits, target


def test_segmentation_metrics_agree_with_torchmetrics_and_sklearn():
    metrics = SegmentationTask().new_metrics()
    logits_all, target_all = [], []
    for seed in range(3):
        logits, target = _random_segmentation(seed)
        metrics.update(logits, target)
        logits_all.append(logits)
        target_all.append(target)
    logits, target = torch.cat(logits_all), torch.cat(target_all)
    result = metrics.compute()
    predicted = logits.argmax(1)
    per_class = MulticlassJaccardIndex(num_classes=13, ignore_index=-1, average="none")(
        predicted, target
    )
    keep = target >= 0
    present = torch.zeros(13, dtype=torch.bool)
    present[target[keep].unique()] = True
    present[predicted[keep].unique()] = True
    assert not present[5]
    assert result["miou"] == pytest.approx(float(per_class[present].mean()), abs=1e-6)
    expected_accuracy = accuracy_score(target[keep].numpy(), predicted[keep].numpy())
    assert result["pixel_acc"] == pytest.approx(expected_accuracy, abs=1e-12)


def test_depth_metrics_are_pooled_over_valid_pixels():
    generator = torch.Generator().manual_seed(0)
    metrics = DepthTask().new_metrics()
    predictions, targets = [], []
    for n in (1, 3):  # unequal batches: pooled, not a mean of batch means
        prediction = torch.rand(n, 1, 5, 6, generator=generator) * 4
        target = torch.rand(n, 1, 5, 6, generator=generator) * 4
        target[target < 1] = 0.0
        metrics.update(prediction, target)
        predictions.append(prediction.numpy().ravel())
        targets.append(target.numpy().ravel())
    p, g = np.concatenate(predictions), np.concatenate(targets)
    valid = g > 0
    error = p[valid] - g[valid]
    result = metrics.compute()
    assert result["abs_err"] == pytest.approx(np.abs(error).mean())
    assert result["rel_err"] == pytest.approx((np.abs(error) / g[valid]).mean())
    assert result["rmse"] == pytest.approx(np.sqrt((error**2).mean()))


def test_normal_metrics_match_numpy():
    generator = torch.Generator().manual_seed(1)
    prediction = torch.randn(2, 3, 7, 8, generator=generator)
    target = F.normalize(torch.randn(2, 3, 7, 8, generator=generator), dim=1)
    target[:, :, :2] = 0.0  # invalid rows
    metrics = NormalTask().new_metrics()
    metrics.update(prediction, target)
    result = metrics.compute()
    p = F.normalize(prediction, dim=1).permute(0, 2, 3, 1).reshape(-1, 3).double().numpy()
    g = target.permute(0, 2, 3, 1).reshape(-1, 3).double().numpy()
    valid = np.abs(g).sum(1) > 0
    angle = np.degrees(np.arccos(np.clip((p[valid] * g[valid]).sum(1), -1, 1)))
    assert result["angle_mean"] == pytest.approx(angle.mean())
    assert result["angle_median"] == pytest.approx(np.median(angle), abs=0.01)
    for threshold in (11.25, 22.5, 30.0):
        assert result[f"within_{threshold:g}"] == pytest.approx((angle < threshold).mean())


@pytest.mark.parametrize("task", [DepthTask(), NormalTask()], ids=["depth", "normal"])
def test_a_split_without_valid_pixels_has_nan_metrics_and_a_nan_worst_and_macro(task):
    metrics = task.new_metrics()
    channels = 1 if task.name == "depth" else 3
    metrics.update(torch.rand(2, channels, 4, 5), torch.zeros(2, channels, 4, 5))
    native = metrics.compute()
    assert native and all(np.isnan(value) for value in native.values())
    score = task.normalized_score(native)
    assert np.isnan(score)
    assert all(np.isnan(value) for value in worst_and_macro({"seg": 0.5, task.name: score}))


def test_losses_ignore_invalid_pixels():
    prediction = torch.zeros(1, 1, 2, 2)
    target = torch.tensor([[[[2.0, 0.0], [4.0, 0.0]]]])
    assert DepthTask().loss(prediction, target) == pytest.approx(3.0)
    normal_target = torch.zeros(1, 3, 1, 2)
    normal_target[0, 2, 0, 0] = 1.0
    normal_prediction = torch.zeros(1, 3, 1, 2)
    normal_prediction[0, 2] = 1.0
    assert NormalTask().loss(normal_prediction, normal_target) == pytest.approx(0.0)
    logits = torch.zeros(1, 13, 1, 2)
    logits[0, 3, 0, 0] = 50.0
    label = torch.tensor([[[3, -1]]])
    assert SegmentationTask().loss(logits, label) == pytest.approx(0.0, abs=1e-6)


def test_audit_scores_are_valid_region_means():
    logits = torch.zeros(2, 13, 2, 2)
    logits[0, 0, 0, 0] = 100.0  # confidence 1 at the only valid pixel of image 0
    label = torch.full((2, 2, 2), -1)
    label[0, 0, 0] = 0
    features = torch.zeros(2, 4, 1, 1)
    features[:, :, 0, 0] = torch.tensor([[3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]])
    depth = torch.zeros(2, 1, 2, 2)
    depth[1] = 1.0
    output = ModelOutput(
        predictions={"seg": logits},
        representation=torch.zeros(2, 1),
        features={"depth": features},
    )
    batch = {"seg": label, "depth": depth}
    seg_score, seg_valid = SegmentationTask().audit_score(output, batch)
    assert seg_score[0] == pytest.approx(1.0) and seg_valid.tolist() == [True, False]
    depth_score, depth_valid = DepthTask().audit_score(output, batch)
    assert depth_valid.tolist() == [False, True]
    assert depth_score[1] == pytest.approx(2.0)  # norm of (0, 0, 0, 2), constant map
