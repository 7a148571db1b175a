"""ReLiF's own variants whose surrogate sees what the audit's clip hides: `relif-logistic` (the
surrogate on a logistic of the ERM-normalised score) and `relif-clipshare` (a penalty on the
share of scores beyond ERM's clip points). Gradients against finite differences and closed
forms, their labels and composition, and their refusal where nothing is squashed."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from relif_ray.config import ExperimentConfig, ReLiFConfig
from relif_ray.errors import UserError
from relif_ray.relif.regularizer import (
    ReLiFRegularizer,
    clip_share_penalty,
    logistic_squash,
    squash_with_gradient,
)
from relif_ray.sweep.labels import (
    RELIF_LABELS,
    display_name,
    grid_variants,
    split_label,
    uses_controller,
    variant,
)
from relif_ray.sweep.preflight import check_squash_gradient

VARIANTS = ("relif-logistic", "relif-clipshare")
BAND = (3.0, 6.0)
"""ERM's q10/q90 of task b's raw scores."""
MIXED = {"a": True, "b": False}


def test_the_logistic_squash_by_hand_and_its_gradient() -> None:
    """sigmoid(4 (u - 1/2)), u = (s - 3) / (3 + 1e-6): 0.12 and 0.88 at ERM's q10 and q90,
    slope 1 / width at the band's middle, and a non-zero gradient beyond the clip points,
    where the clip's is 0."""
    raw = torch.tensor([0.0, 3.0, 4.5, 6.0, 9.0, 15.0], dtype=torch.float64, requires_grad=True)
    low, high = torch.tensor(BAND[0], dtype=torch.float64), torch.tensor(BAND[1]).double()
    values = logistic_squash(raw, low, high)
    width = BAND[1] - BAND[0] + 1e-6
    u = (raw.detach().numpy() - BAND[0]) / width
    expected = 1 / (1 + np.exp(-4 * (u - 0.5)))
    np.testing.assert_allclose(values.detach().numpy(), expected, rtol=1e-14)
    assert values[1].item() == pytest.approx(1 / (1 + math.exp(2)), rel=1e-5)  # 0.119
    assert values[3].item() == pytest.approx(1 / (1 + math.exp(-2)), rel=1e-5)  # 0.881
    values.sum().backward()
    np.testing.assert_allclose(raw.grad.numpy(), 4 * expected * (1 - expected) / width, rtol=1e-12)
    assert raw.grad[2].item() == pytest.approx(1 / width, rel=1e-9)  # the clip's slope there
    clip_raw = raw.detach().clone().requires_grad_(True)
    squash_with_gradient(clip_raw, low, high).sum().backward()
    beyond = torch.tensor([True, False, False, False, True, True])
    assert (clip_raw.grad[beyond] == 0).all() and (raw.grad[beyond] > 0).all()
    assert torch.autograd.gradcheck(
        lambda x: logistic_squash(x, low, high), (raw.detach().clone().requires_grad_(True),)
    )


def test_the_clip_share_penalty_by_hand_and_against_finite_differences() -> None:
    """Per squashed task (Q_0.9(u) - 1)_+ + (-Q_0.1(u))_+ over the valid finite batch scores;
    0 for a task at or inside ERM's share beyond the clip points, and unsquashed rows add 0."""
    raw = torch.tensor(
        [
            [0.1, 0.9, 0.5, 0.3, 0.7, 0.2],  # a probability task: never penalised
            [2.0, 4.0, 5.0, 9.0, 12.0, math.nan],  # beyond both clip points
            [3.5, 4.0, 4.5, 5.0, 5.5, 5.9],  # inside the band: 0
        ],
        dtype=torch.float64,
    )
    valid = torch.tensor([[True] * 6, [True] * 6, [True] * 5 + [False]])
    low = torch.tensor([0.0, *[BAND[0]] * 2], dtype=torch.float64)
    high = torch.tensor([1.0, *[BAND[1]] * 2], dtype=torch.float64)
    rows = torch.tensor([False, True, True])
    width = BAND[1] - BAND[0] + 1e-6
    u = (np.array([2.0, 4.0, 5.0, 9.0, 12.0]) - BAND[0]) / width
    expected = max(np.quantile(u, 0.9) - 1, 0) + max(-np.quantile(u, 0.1), 0)
    assert expected > 0.5
    value = clip_share_penalty(raw, valid, low, high, rows)
    assert value.item() == pytest.approx(expected, rel=1e-12)
    assert clip_share_penalty(raw[2:], valid[2:], low[2:], high[2:], rows[2:]).item() == 0.0
    leaf = torch.tensor([[2.0, 3.5, 5.0, 9.0, 12.0, 4.4]], dtype=torch.float64)  # off the kinks
    ones = torch.ones(1, 6, dtype=torch.bool)
    assert torch.autograd.gradcheck(
        lambda x: clip_share_penalty(x, ones, low[1:2], high[1:2], rows[1:2]),
        (leaf.requires_grad_(True),),
    )


def regularizer_batch(b: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """Task a's probabilities and task b's raw depth-like scores of 4 examples at 0-90 deg."""
    a = torch.tensor([0.9, 0.6, 0.4, 0.1], dtype=torch.float64)
    angles = torch.tensor([0.0, 30.0, 60.0, 90.0], dtype=torch.float64).deg2rad()
    representation = torch.stack([angles.cos(), angles.sin()], dim=1)
    valid = torch.ones(4, dtype=torch.bool)
    return {"a": (a, valid), "b": (b, valid)}, representation


@pytest.mark.parametrize("label", [*VARIANTS, "relif"])
def test_each_variants_regularizer_gradient_against_finite_differences(label: str) -> None:
    """lambda_t * (L_lip [+ penalty]) as a function of task b's raw scores, from the same state
    at every call (a copy of one warm regularizer; tau = kappa = 1, so no detached statistic
    moves with the input): torch.autograd.gradcheck in float64. Two scores lie beyond ERM's
    q90, where the paper's clip passes no gradient."""
    fields = {key.removeprefix("relif."): value for key, value in RELIF_LABELS[label].items()}
    settings = dict(enabled=True, warmup_steps=0, prototypes_per_task=3, eta=0.5)
    relif = ReLiFConfig(
        **settings, quantile_alignment=False, squash_constants={"b": list(BAND)}, **fields
    )
    warm = ReLiFRegularizer(relif, ["a", "b"]).double()
    warm(*regularizer_batch(torch.tensor([4.0, 5.0, 6.5, 2.0], dtype=torch.float64)), MIXED)
    raw = torch.tensor([7.0, 9.0, 5.0, 1.0], dtype=torch.float64, requires_grad=True)

    def loss(b: torch.Tensor) -> torch.Tensor:
        value, _ = copy.deepcopy(warm)(*regularizer_batch(b), MIXED)
        return value

    assert torch.autograd.gradcheck(loss, (raw,))
    (gradient,) = torch.autograd.grad(loss(raw), raw)
    beyond = gradient[:2]  # the two scores above ERM's q90
    if label == "relif":
        assert (beyond == 0).all()
    else:
        assert (beyond > 0).all()  # both pull the saturated scores back down


def test_clipshare_adds_the_penalty_and_logistic_keeps_the_clipped_share_statistic() -> None:
    """Same state and batch: clipshare's loss is relif's plus lambda_t x the penalty, with the
    same statistics; logistic's trace counts the same prototypes clipped by the audit."""
    runs = {}
    for label in ("relif", *VARIANTS):
        fields = {k.removeprefix("relif."): v for k, v in RELIF_LABELS[label].items()}
        relif = ReLiFConfig(
            enabled=True, prototypes_per_task=3, squash_constants={"b": list(BAND)}, **fields
        )
        regularizer = ReLiFRegularizer(relif, ["a", "b"]).double()
        raw = torch.tensor([7.0, 9.0, 5.0, 1.0], dtype=torch.float64)
        runs[label] = regularizer(*regularizer_batch(raw), MIXED)
    (plain, plain_stats), (share, share_stats) = runs["relif"], runs["relif-clipshare"]
    valid = torch.ones(2, 4, dtype=torch.bool)
    both = torch.stack([torch.tensor([0.9, 0.6, 0.4, 0.1]).double(), raw])
    low, high = torch.tensor([0.0, BAND[0]]).double(), torch.tensor([1.0, BAND[1]]).double()
    penalty = clip_share_penalty(both, valid, low, high, torch.tensor([False, True]))
    assert penalty.item() > 0
    lam = plain_stats["lambda"].item()
    assert share.item() == pytest.approx(plain.item() + lam * penalty.item(), rel=1e-12)
    for key, value in plain_stats.items():
        np.testing.assert_equal(share_stats[key].item(), value.item())
    logistic_stats = runs["relif-logistic"][1]
    assert logistic_stats["clipped"].item() == plain_stats["clipped"].item() == pytest.approx(2 / 3)


def test_variant_labels_parse_compose_and_adapt() -> None:
    assert split_label("relif-logistic") == ("erm", "relif-logistic")
    assert split_label("pcgrad+relif-clipshare") == ("pcgrad", "relif-clipshare")
    assert display_name("fairgrad+relif-logistic") == "FairGrad+ReLiF-logistic"
    assert display_name("relif-clipshare") == "ReLiF-clipshare"
    for label in (*VARIANTS, *(f"gradnorm+{name}" for name in VARIANTS)):
        assert uses_controller(label)
    assert variant("cagrad+relif-logistic")["overrides"] == {
        "method.name": "cagrad",
        "relif.enabled": True,
        "relif.surrogate_score": "logistic",
    }
    assert variant("relif-clipshare", 0.3, 1e-3)["overrides"] == {
        "method.name": "erm",
        "relif.enabled": True,
        "relif.clip_share_penalty": True,
        "relif.r_star": 0.3,
        "relif.eta": 1e-3,
    }
    grid = grid_variants(["relif-logistic", "pcgrad+relif-clipshare"], [0.2, 0.3], [1e-3])
    assert [item["label"] for item in grid] == ["relif-logistic"] * 2 + [
        "pcgrad+relif-clipshare"
    ] * 2
    with pytest.raises(UserError, match=r"cannot parse 'pcgrad\+relif-rank'"):
        split_label("pcgrad+relif-rank")


def test_logistic_needs_the_clip_gradient_in_one_line() -> None:
    with pytest.raises(UserError) as error:
        ExperimentConfig.from_dict(
            {"relif": {"surrogate_score": "logistic", "squash_gradient": "straight_through"}}
        )
    assert str(error.value).count("\n") == 0
    assert "relif.surrogate_score: logistic" in str(error.value)
    with pytest.raises(UserError, match="relif.surrogate_score: must be one of"):
        ExperimentConfig.from_dict({"relif": {"surrogate_score": "rank"}})


@pytest.mark.parametrize(
    ("label", "field"),
    [
        ("relif-logistic", "relif.surrogate_score: logistic"),
        ("relif-clipshare", "relif.clip_share_penalty: true"),
    ],
)
def test_each_variant_is_refused_in_one_line_without_a_squashed_task(label, field) -> None:
    config = ExperimentConfig.from_dict(
        {"data": {"dataset": "mimic3"}, "relif": {"enabled": True, **fields_of(label)}}
    )
    with pytest.raises(UserError) as error:
        check_squash_gradient(config, frozenset())
    assert str(error.value) == (
        f"config field {field} (label {label}) changes nothing on mimic3, whose audit scores "
        "are all probabilities (no squash); use relif"
    )
    check_squash_gradient(config, frozenset({"depth"}))  # a squashed task: accepted


def fields_of(label: str) -> dict:
    return {key.removeprefix("relif."): value for key, value in RELIF_LABELS[label].items()}
