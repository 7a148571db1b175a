"""ReLiF inside the engine on tiny synthetic NYUv2: the trace obeys the controller recursion.

The data are NYUv2-shaped tensors built in memory (24 train / 12 val images of 32x40 with
invalid pixels), so these tests exercise the real tasks, dense model and engine without
depending on the on-disk reader.
"""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as F

from relif_ray.config import ExperimentConfig
from relif_ray.engine import TrainingRun
from relif_ray.models.dense import DenseMTLModel
from relif_ray.problems import Problem, TensorSplit
from relif_ray.tasks.nyuv2 import nyuv2_tasks
from tests.conftest import tiny_config

RELIF = {"enabled": True, "warmup_steps": 2, "eta": 0.5, "r_star": 0.24}


def nyuv2_like_split(n: int, seed: int, height: int = 32, width: int = 40) -> TensorSplit:
    generator = torch.Generator().manual_seed(seed)
    invalid = torch.rand(n, height, width, generator=generator) < 0.1
    seg = torch.randint(0, 13, (n, height, width), generator=generator)
    depth = torch.rand(n, 1, height, width, generator=generator) * 5 + 0.5
    normal = F.normalize(torch.randn(n, 3, height, width, generator=generator), dim=1)
    return TensorSplit(
        {
            "input": torch.rand(n, 3, height, width, generator=generator),
            "seg": seg.masked_fill(invalid, -1),
            "depth": depth.masked_fill(invalid[:, None], 0.0),
            "normal": normal.masked_fill(invalid[:, None], 0.0),
            "example_id": torch.arange(n),
        }
    )


@pytest.fixture(scope="module")
def problem() -> Problem:
    splits = {"train": nyuv2_like_split(24, 0), "val": nyuv2_like_split(12, 1)}
    return Problem("nyuv2", nyuv2_tasks(), splits, DenseMTLModel)


def run(problem: Problem, relif: dict | None = None) -> TrainingRun:
    values = tiny_config("unused")
    if relif is not None:
        values["relif"] = {**values["relif"], **relif}
    return TrainingRun(ExperimentConfig.from_dict(values), problem)


def finish(training: TrainingRun) -> list[dict[str, float]]:
    while not training.finished:
        training.train_epoch()
    return training.trace


@pytest.fixture(scope="module")
def relif_trace(problem: Problem) -> list[dict[str, float]]:
    """The trace of one whole ReLiF run: the recursion's test and the resume's reference."""
    return finish(run(problem, RELIF))


def test_trace_obeys_the_controller_recursion(relif_trace) -> None:
    trace = relif_trace
    assert len(trace) == 8
    for row in trace:
        assert {"lambda", "r", "r_ema", "tau", "kappa", "loss_lip"} <= set(row)
        assert {"loss_seg", "loss_depth", "loss_normal"} <= set(row)
    lam, r_ema, updates = 0.1, None, 0
    for row in trace:
        if math.isnan(row["r"]):  # no valid pair: state unchanged
            assert row["lambda"] == pytest.approx(lam)
            continue
        updates += 1
        r_ema = row["r"] if r_ema is None else 0.1 * row["r"] + 0.9 * r_ema
        if updates > 2:
            lam = min(max(lam * (1 + 0.5 * (r_ema - 0.24)), 0.01), 1.0)
        assert row["r_ema"] == pytest.approx(r_ema, rel=1e-5)
        assert row["lambda"] == pytest.approx(lam, rel=1e-5)
        assert 0 <= row["r"] <= 1 and row["loss_lip"] >= 0
        assert row["tau"] >= 1e-4 and row["kappa"] >= 1e-3
    assert updates > 2 and trace[-1]["lambda"] != 0.1  # the controller acted


def test_relif_changes_training_and_its_no_lip_ablation_does_not(problem) -> None:
    erm = run(problem)
    erm.train_steps(4)
    relif = run(problem, {**RELIF, "warmup_steps": 0, "lambda0": 1.0})
    relif.train_steps(4)
    no_lip = run(problem, {**RELIF, "lipschitz_branch": False})
    no_lip.train_steps(4)
    losses = [key for key in erm.trace[0] if key.startswith("loss_")]
    assert [[row[k] for k in losses] for row in no_lip.trace] == [
        [row[k] for k in losses] for row in erm.trace
    ]
    assert all(row["lambda"] == 0.0 and not math.isnan(row["r"]) for row in no_lip.trace)
    assert relif.trace[-1]["loss_seg"] != erm.trace[-1]["loss_seg"]


def test_resume_with_relif_matches_uninterrupted_run(problem, relif_trace) -> None:
    uninterrupted = relif_trace
    interrupted = run(problem, RELIF)
    interrupted.train_steps(5)  # past warmup, inside epoch 2
    buffer = io.BytesIO()
    torch.save(interrupted.state_dict(), buffer)
    buffer.seek(0)
    resumed = run(problem, RELIF)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.regularizer.controller.updates.item() == 5
    assert finish(resumed) == uninterrupted
