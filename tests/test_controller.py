"""The violation-rate controller: the paper's Eqs. 11 and 12, step by step."""

from __future__ import annotations

import pytest
import torch

from relif_ray.relif.controller import ViolationController


def make(**overrides: float) -> ViolationController:
    settings = dict(
        lambda0=0.1,
        lambda_min=0.01,
        lambda_max=1.0,
        warmup_steps=2,
        violation_ema=0.1,
        r_star=0.24,
        eta=0.5,
    )
    settings.update(overrides)
    return ViolationController(**settings)


def test_recursion_step_by_step_with_warmup() -> None:
    controller = make()
    rates = [0.5, 0.1, 0.9, 0.3, 0.0]
    r_ema, lam = None, 0.1
    for t, r in enumerate(rates, start=1):
        returned = controller.update(torch.tensor(r))
        r_ema = r if r_ema is None else 0.1 * r + 0.9 * r_ema  # r~_0 = r_0
        if t > 2:  # warmup: the first two updates keep lambda0
            lam = min(max(lam * (1 + 0.5 * (r_ema - 0.24)), 0.01), 1.0)
        assert controller.r_ema.item() == pytest.approx(r_ema, rel=1e-6)
        assert returned.item() == pytest.approx(lam, rel=1e-6)
        assert controller.updates.item() == t
    assert lam != 0.1  # the recursion did move lambda after warmup


def test_first_updates_leave_lambda_at_lambda0_during_warmup() -> None:
    controller = make(warmup_steps=3, eta=10.0)
    for _ in range(3):
        assert controller.update(torch.tensor(1.0)).item() == pytest.approx(0.1)
    assert controller.update(torch.tensor(1.0)).item() > 0.1


@pytest.mark.parametrize(("rate", "bound"), [(1.0, 1.0), (0.0, 0.01)])
def test_lambda_is_clipped(rate: float, bound: float) -> None:
    controller = make(warmup_steps=0, eta=1.5, violation_ema=1.0)
    for _ in range(50):
        value = controller.update(torch.tensor(rate)).item()
        assert 0.01 - 1e-9 <= value <= 1.0 + 1e-9
    assert value == pytest.approx(bound)


def test_zero_warmup_updates_on_first_step() -> None:
    controller = make(warmup_steps=0, eta=1.0)
    assert controller.update(torch.tensor(0.44)).item() == pytest.approx(0.1 * 1.2)


def test_static_mode_keeps_lambda0_but_tracks_the_violation_ema() -> None:
    controller = make(warmup_steps=0, eta=5.0, adaptive=False)
    for r in (0.9, 0.8, 0.7):
        assert controller.update(torch.tensor(r)).item() == pytest.approx(0.1)
    assert controller.r_ema.item() == pytest.approx(0.1 * 0.7 + 0.9 * (0.1 * 0.8 + 0.9 * 0.9))


def test_state_round_trips_through_state_dict() -> None:
    controller = make(warmup_steps=0)
    for r in (0.6, 0.2):
        controller.update(torch.tensor(r))
    state = controller.state_dict()
    assert set(state) == {"lambda_", "r_ema", "updates"}
    restored = make(warmup_steps=0)
    restored.load_state_dict(state)
    assert restored.update(torch.tensor(0.5)).item() == controller.update(torch.tensor(0.5)).item()
    assert restored.updates.item() == 3


def test_returned_lambda_is_a_detached_copy() -> None:
    controller = make(warmup_steps=0)
    first = controller.update(torch.tensor(0.9, requires_grad=True))
    kept = first.item()
    controller.update(torch.tensor(0.9))
    assert not first.requires_grad and first.item() == kept


def test_an_inactive_update_changes_nothing() -> None:
    """A step without pairs (active=False, a device tensor) neither ages the EMA nor the warmup."""
    controller = make(warmup_steps=1, eta=2.0)
    reference = make(warmup_steps=1, eta=2.0)
    for r in (0.5, 0.9, 0.1):
        before = {key: value.clone() for key, value in controller.state_dict().items()}
        returned = controller.update(torch.tensor(0.7), active=torch.tensor(False))
        assert returned.item() == before["lambda_"].item()
        for key, value in controller.state_dict().items():
            assert torch.equal(value.isnan(), before[key].isnan()), key
            assert torch.equal(value.nan_to_num(), before[key].nan_to_num()), key
        assert controller.update(torch.tensor(r), active=torch.tensor(True)).item() == (
            reference.update(torch.tensor(r)).item()
        )
    assert controller.updates.item() == 3 and controller.lambda_.item() != 0.1
