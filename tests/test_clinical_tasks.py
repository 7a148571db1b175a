"""Clinical tasks: metrics agree with scikit-learn (the benchmark's own calls), losses respect
masks, audit scores follow docs/clinical.md (task table)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn import metrics as skm

from relif_ray.tasks.base import ModelOutput
from relif_ray.tasks.clinical import (
    LOS_BIN_MEAN_HOURS,
    DecompensationTask,
    LengthOfStayTask,
    MortalityTask,
    PhenotypeTask,
    auprc_trapezoid,
    binary_auroc,
    linear_weighted_kappa,
    los_bins,
)


def _benchmark_bin(hours: float) -> int:
    """The MIMIC-III benchmark's (Harutyunyan et al.) mimic3models/metrics.py get_bin_custom,
    restated: bins (-inf,1),(1,2),...,(8,14),(14,inf) days, lower edge included."""
    edges_days = [(-np.inf, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 14)]
    for index, (low, high) in enumerate(edges_days):
        if low * 24 <= hours < high * 24:
            return index
    return 9


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auroc_and_trapezoid_auprc_match_sklearn_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 300)
    scores = np.round(rng.random(300) + 0.3 * labels, 1)  # coarse: many ties
    precision, recall, _ = skm.precision_recall_curve(labels, scores)
    assert binary_auroc(scores, labels) == pytest.approx(
        skm.roc_auc_score(labels, scores), abs=1e-12
    )
    assert auprc_trapezoid(scores, labels) == pytest.approx(skm.auc(recall, precision), abs=1e-12)


def test_trapezoid_auprc_is_not_average_precision_when_scores_tie() -> None:
    labels = np.array([1, 0, 1, 0, 0, 1])
    scores = np.array([0.9, 0.9, 0.5, 0.5, 0.1, 0.1])
    assert auprc_trapezoid(scores, labels) != pytest.approx(
        skm.average_precision_score(labels, scores), abs=1e-3
    )


def test_binary_metrics_undefined_with_one_class_are_nan() -> None:
    assert np.isnan(binary_auroc(np.array([0.1, 0.4]), np.array([0, 0])))
    assert np.isnan(auprc_trapezoid(np.array([0.1, 0.4]), np.array([0, 0])))


@pytest.mark.parametrize("seed", [0, 1])
def test_linear_kappa_matches_sklearn_including_absent_bins(seed: int) -> None:
    rng = np.random.default_rng(seed)
    truth = rng.choice([0, 2, 3, 7, 9], 200)  # bins 1, 4, 5, 6, 8 never occur
    predicted = np.clip(truth + rng.integers(-2, 3, 200), 0, 9)
    expected = skm.cohen_kappa_score(truth, predicted, weights="linear")
    assert linear_weighted_kappa(truth, predicted) == pytest.approx(expected, abs=1e-12)


def test_los_bins_are_half_open_in_hours() -> None:
    hours = torch.tensor([0.0, 23.99, 24.0, 47.9, 48.0, 191.9, 192.0, 335.9, 336.0, 5000.0])
    assert los_bins(hours).tolist() == [0, 0, 1, 1, 2, 7, 8, 8, 9, 9]
    assert los_bins(hours).tolist() == [_benchmark_bin(float(h)) for h in hours]
    per_step = los_bins(hours.reshape(2, 5))  # (stays, steps), as the loss bins them
    assert per_step.dtype == torch.long and per_step.flatten().tolist() == los_bins(hours).tolist()


def test_mortality_metrics_use_labelled_stays_only_and_match_sklearn() -> None:
    rng = np.random.default_rng(3)
    logits = torch.tensor(rng.normal(size=40))
    target = torch.tensor(np.stack([rng.integers(0, 2, 40), rng.integers(0, 2, 40)], 1)).float()
    task = MortalityTask()
    accumulator = task.new_metrics()
    accumulator.update(logits[:25], target[:25])
    accumulator.update(logits[25:], target[25:])
    result = accumulator.compute()
    keep = target[:, 0].numpy() == 1
    labels, probs = target[keep, 1].numpy(), torch.sigmoid(logits[keep]).numpy()
    precision, recall, _ = skm.precision_recall_curve(labels, probs)
    assert result["auroc"] == pytest.approx(skm.roc_auc_score(labels, probs), abs=1e-9)
    assert result["auprc"] == pytest.approx(skm.auc(recall, precision), abs=1e-9)
    assert task.normalized_score(result) == result["auroc"]


def test_decompensation_metrics_pool_labelled_steps_of_all_stays() -> None:
    rng = np.random.default_rng(4)
    logits = torch.tensor(rng.normal(size=(6, 9)))
    mask = torch.tensor(rng.integers(0, 2, (6, 9))).float()
    labels = torch.tensor(rng.integers(0, 2, (6, 9))).float()
    accumulator = DecompensationTask().new_metrics()
    accumulator.update(logits, torch.stack([mask, labels], -1))
    keep = mask.numpy() == 1
    expected = skm.roc_auc_score(labels.numpy()[keep], torch.sigmoid(logits).numpy()[keep])
    assert accumulator.compute()["auroc"] == pytest.approx(expected, abs=1e-9)


def test_phenotype_macro_auroc_matches_sklearn() -> None:
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 2, (60, 25))
    logits = torch.tensor(rng.normal(size=(60, 25)) + labels)
    accumulator = PhenotypeTask().new_metrics()
    accumulator.update(logits[:30], torch.tensor(labels[:30]).float())
    accumulator.update(logits[30:], torch.tensor(labels[30:]).float())
    expected = skm.roc_auc_score(labels, torch.sigmoid(logits).numpy(), average="macro")
    assert accumulator.compute()["auroc_macro"] == pytest.approx(expected, abs=1e-9)


def test_binary_and_phenotype_metrics_stay_exact_for_saturating_float32_logits() -> None:
    """Logits above about 17 have a float32 sigmoid of exactly 1.0; the ranking must not tie."""
    logits = torch.tensor([17.5, 18.0, 19.0, 20.0, -3.0, 25.0, 40.0, 33.0])
    labels = np.array([0, 1, 0, 1, 0, 1, 1, 0])
    probabilities = 1.0 / (1.0 + np.exp(-logits.double().numpy()))  # float64: no ties
    precision, recall, _ = skm.precision_recall_curve(labels, probabilities)
    binary = MortalityTask().new_metrics()
    binary.update(logits, torch.tensor(np.stack([np.ones(8), labels], 1)).float())
    result = binary.compute()
    assert result["auroc"] == pytest.approx(skm.roc_auc_score(labels, probabilities), abs=1e-12)
    assert result["auprc"] == pytest.approx(skm.auc(recall, precision), abs=1e-12)
    first_four = MortalityTask().new_metrics()
    first_four.update(logits[:4], torch.tensor([[1, 0], [1, 1], [1, 0], [1, 1]]).float())
    assert first_four.compute()["auroc"] == 0.75
    phenotype = PhenotypeTask().new_metrics()
    phenotype.update(logits[:, None].repeat(1, 2), torch.tensor(labels[:, None]).repeat(1, 2))
    expected = skm.roc_auc_score(labels, probabilities)
    assert phenotype.compute()["auroc_macro"] == pytest.approx(expected, abs=1e-12)


def test_length_of_stay_kappa_and_mad_follow_the_benchmark() -> None:
    rng = np.random.default_rng(6)
    hours = torch.tensor(rng.uniform(0, 700, size=(5, 12)))
    mask = torch.tensor(rng.integers(0, 2, (5, 12))).float()
    logits = torch.tensor(rng.normal(size=(5, 12, 10)))
    task = LengthOfStayTask()
    accumulator = task.new_metrics()
    accumulator.update(logits, torch.stack([mask, hours], -1))
    result = accumulator.compute()
    keep = mask.numpy() == 1
    true_hours = hours.numpy()[keep]
    estimates = np.array(LOS_BIN_MEAN_HOURS)[logits.numpy()[keep].argmax(-1)]
    true_bins = [_benchmark_bin(h) for h in true_hours]
    predicted_bins = [_benchmark_bin(e) for e in estimates]
    kappa = skm.cohen_kappa_score(true_bins, predicted_bins, weights="linear")
    assert result["kappa"] == pytest.approx(kappa, abs=1e-9)
    assert result["mad"] == pytest.approx(skm.mean_absolute_error(true_hours, estimates), abs=1e-9)
    assert task.normalized_score(result) == pytest.approx((kappa + 1) / 2)


def test_masked_losses_equal_losses_on_the_labelled_entries() -> None:
    rng = np.random.default_rng(7)
    logits = torch.tensor(rng.normal(size=(4, 6)))
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [0] * 6, [1, 0, 1, 0, 1, 0], [1] * 6]).float()
    labels = torch.tensor(rng.integers(0, 2, (4, 6))).float()
    keep = mask.bool()
    expected = F.binary_cross_entropy_with_logits(logits[keep], labels[keep])
    loss = DecompensationTask().loss(logits, torch.stack([mask, labels], -1))
    assert float(loss) == pytest.approx(float(expected), abs=1e-6)

    hours = torch.tensor(rng.uniform(0, 500, (4, 6)))
    los_logits = torch.tensor(rng.normal(size=(4, 6, 10)))
    expected = F.cross_entropy(los_logits[keep], los_bins(hours[keep]))
    loss = LengthOfStayTask().loss(los_logits, torch.stack([mask, hours], -1))
    assert float(loss) == pytest.approx(float(expected), abs=1e-6)


def test_a_batch_without_labels_gives_zero_loss_with_a_gradient() -> None:
    logits = torch.zeros(3, requires_grad=True)
    loss = MortalityTask().loss(logits, torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 1.0]]))
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert logits.grad is not None and float(logits.grad.abs().sum()) == 0.0


def test_audit_scores_follow_design() -> None:
    rng = np.random.default_rng(8)
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [0, 1, 1]]).float()
    predictions = {
        "mortality": torch.tensor(rng.normal(size=3)),
        "decompensation": torch.tensor(rng.normal(size=(3, 3))),
        "length_of_stay": torch.tensor(rng.normal(size=(3, 3, 10))),
        "phenotype": torch.tensor(rng.normal(size=(3, 25))),
    }
    batch = {
        "mortality": torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]),
        "decompensation": torch.stack([mask, torch.zeros(3, 3)], -1),
        "length_of_stay": torch.stack([mask, torch.ones(3, 3)], -1),
        "phenotype": torch.zeros(3, 25),
    }
    output = ModelOutput(predictions=predictions, representation=torch.zeros(3, 2))

    score, valid = MortalityTask().audit_score(output, batch)
    assert torch.allclose(score, torch.sigmoid(predictions["mortality"]))
    assert valid.tolist() == [True, False, True]

    score, valid = DecompensationTask().audit_score(output, batch)
    probs = torch.sigmoid(predictions["decompensation"])
    assert torch.allclose(score[[0, 2]], torch.stack([probs[0, :2].mean(), probs[2, 1:].mean()]))
    assert valid.tolist() == [True, False, True]

    score, valid = LengthOfStayTask().audit_score(output, batch)
    confidence = torch.softmax(predictions["length_of_stay"], -1).max(-1).values
    assert torch.allclose(score[0], confidence[0, :2].mean())
    assert valid.tolist() == [True, False, True]

    score, valid = PhenotypeTask().audit_score(output, batch)
    assert torch.allclose(score, torch.sigmoid(predictions["phenotype"]).max(-1).values)
    assert valid.all()

    for task in (MortalityTask(), DecompensationTask(), LengthOfStayTask(), PhenotypeTask()):
        assert task.score_is_probability is True
