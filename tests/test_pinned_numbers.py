"""Pinned numbers (`tests/pinned.py`): every method's short trial matches the pins within the
tolerance derived from measured cross-kernel drift; that drift passes and small real changes
(a loss weight changed by 1%, one skipped optimiser step, 3 prototypes instead of 4) fail."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from relif_ray.engine import TrainingRun
from tests import pinned
from tests.pinned import KERNEL_SETS, KEYS, PINS, compute, drift, exceeded


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pinned trials' data, written once for this module."""
    return tmp_path_factory.mktemp("pins")


@pytest.fixture(scope="module")
def computed(workdir: Path) -> dict:
    return compute(workdir)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.slow
def test_numbers_match_the_pins_within_the_cross_kernel_tolerance(computed: dict, key: str):
    pinned_numbers = json.loads(PINS.read_text())[key]
    assert pinned_numbers["trace"], "a pinned trial trains at least one step"
    assert exceeded({key: computed[key]}) == []


@pytest.mark.slow
def test_the_measured_cross_kernel_drift_passes(tmp_path: Path) -> None:
    """Recomputed here with the oldest kernels (ATen without vector units, oneDNN SSE4.1,
    MKL's compatible path), the numbers move, and stay within the tolerance."""
    keys = ["nyuv2/erm", "mimic3/relif"]
    other = pinned.compute_with_kernels(KERNEL_SETS["oldest-cpu"], tmp_path, keys)
    found = drift(other)
    for key in keys:
        assert max(stage.relative for stage in found[key].values()) > 0, f"{key} did not move"
    assert exceeded(other) == []


@pytest.fixture
def heavier_depth_loss(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The method's backward weighs the depth loss 1.01 instead of 1 (the trace still records
    the losses and weights the method reports, so only the training dynamics change)."""
    backward = TrainingRun._backward

    def weighted(self: TrainingRun, batch: dict) -> dict:
        method_backward = self.method.backward
        self.method.backward = lambda losses, ctx, extra_loss=None: method_backward(
            {**losses, "depth": 1.01 * losses["depth"]}, ctx, extra_loss
        )
        try:
            return backward(self, batch)
        finally:
            del self.method.backward

    monkeypatch.setattr(TrainingRun, "_backward", weighted)
    yield


@pytest.fixture
def second_step_skipped(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The optimiser does not update the weights at step 1; the trace keeps its 3 rows."""
    train_step = TrainingRun._train_step

    def skipping(self):
        if self.step != 1:
            return train_step(self)
        update = self.optimizer.step
        self.optimizer.step = lambda *args, **kwargs: None
        try:
            return train_step(self)
        finally:
            self.optimizer.step = update

    monkeypatch.setattr(TrainingRun, "_train_step", skipping)
    yield


@pytest.fixture
def three_prototypes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """relif.prototypes_per_task 3 instead of the default 4."""
    base = pinned.nyuv2_base

    def with_three(root: Path, device: str = "cpu") -> dict:
        config = base(root, device)
        config["relif"]["prototypes_per_task"] = 3
        return config

    monkeypatch.setattr(pinned, "nyuv2_base", with_three)
    yield


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ("heavier_depth_loss", "nyuv2/erm"),
        ("second_step_skipped", "nyuv2/erm"),
        ("three_prototypes", "nyuv2/relif"),
    ],
)
def test_a_small_real_change_exceeds_the_tolerance(
    change: str, key: str, workdir: Path, request: pytest.FixtureRequest
) -> None:
    request.getfixturevalue(change)
    changed = compute(workdir, keys=[key])
    assert exceeded(changed), f"{change} on {key} passes as cross-kernel drift"
