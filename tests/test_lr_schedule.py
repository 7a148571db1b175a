"""Learning-rate schedules (`train.scheduler`): the rate of each step in the trace against
the closed forms, exact resume mid-epoch and at an epoch boundary, and one-line config errors
before Ray starts."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from relif_ray.config import ExperimentConfig
from relif_ray.engine import TrainingRun
from relif_ray.errors import UserError
from tests.conftest import HANG_GUARD_S, tiny_config, tiny_resnets
from tests.test_engine import _roundtrip

REPO = Path(__file__).resolve().parents[1]
LR = 1e-3
STEPS_PER_EPOCH = 4  # the tiny data set: 24 training examples, batch 6
SCHEDULES = {
    "step": {"scheduler": "step", "scheduler_step_size": 2, "scheduler_gamma": 0.1},
    "cosine": {"scheduler": "cosine", "scheduler_min_lr": 1e-4},
}
"""step_size 2 over 3 epochs: a restarted schedule (last_epoch 0 after a resume) would keep
epoch 2 at the full rate, so the resume tests fail unless the schedule's state is restored."""


def _run(root, **train) -> TrainingRun:
    """A run on the tiny ResNet encoder (`tests.conftest.tiny_resnet`): the rates
    and the resume are the same for any model, and ResNet-18's 11M parameters would cost
    each step's gradients and Adam step."""
    with tiny_resnets():
        return TrainingRun(ExperimentConfig.from_dict(tiny_config(root, lr=LR, **train)))


def _finish(run: TrainingRun) -> TrainingRun:
    while not run.finished:
        run.train_epoch()
    return run


def _step_lrs(run: TrainingRun) -> list[float]:
    return [row["lr"] for row in run.trace]


@pytest.fixture(scope="module")
def uninterrupted(nyuv2_dir) -> dict[str, TrainingRun]:
    return {
        name: _finish(_run(nyuv2_dir, epochs=3, **fields)) for name, fields in SCHEDULES.items()
    }


def test_step_schedule_multiplies_by_gamma_every_step_size_epochs(uninterrupted):
    run = uninterrupted["step"]  # 3 epochs
    expected = [LR * 0.1 ** ((step // STEPS_PER_EPOCH) // 2) for step in range(12)]
    assert _step_lrs(run) == pytest.approx(expected, rel=1e-12)


def test_cosine_schedule_follows_the_closed_form_over_the_runs_epochs(nyuv2_dir):
    """Default horizon: the epochs of the budget, here 6 steps = 2 epochs (the last partial)."""
    run = _finish(_run(nyuv2_dir, epochs=None, max_steps=6, **SCHEDULES["cosine"]))

    def cosine(epoch: int, horizon: int = 2) -> float:
        return 1e-4 + (LR - 1e-4) * (1 + math.cos(math.pi * epoch / horizon)) / 2

    expected = [cosine(step // STEPS_PER_EPOCH) for step in range(6)]
    assert _step_lrs(run) == pytest.approx(expected, rel=1e-12)
    assert run.lr_scheduler.last_epoch == 1  # the partial last epoch stepped nothing


def test_no_schedule_keeps_the_configured_rate(nyuv2_dir):
    run = _run(nyuv2_dir, epochs=None, max_steps=2)
    run.train_steps(2)
    assert run.lr_scheduler is None and _step_lrs(run) == [LR, LR]


@pytest.mark.parametrize(
    ("schedule", "stop"),
    [("step", STEPS_PER_EPOCH), ("step", STEPS_PER_EPOCH + 1), ("cosine", STEPS_PER_EPOCH)],
    ids=["step-epoch-boundary", "step-mid-epoch", "cosine-epoch-boundary"],
)
def test_resume_ends_with_the_numbers_of_an_uninterrupted_run(
    nyuv2_dir, uninterrupted, schedule, stop
):
    interrupted = _run(nyuv2_dir, epochs=3, **SCHEDULES[schedule])
    interrupted.train_steps(stop)
    state = _roundtrip(interrupted.state_dict())  # torch.load(weights_only=True)
    resumed = _run(nyuv2_dir, epochs=3, **SCHEDULES[schedule])
    resumed.load_state_dict(state)
    _finish(resumed)
    reference = uninterrupted[schedule]
    assert len(set(_step_lrs(reference))) > 1  # the schedule changed the rate
    assert resumed.trace == reference.trace
    assert resumed.evaluate("val").metrics == reference.evaluate("val").metrics


@pytest.mark.parametrize(
    ("train", "fragment"),
    [
        ({"scheduler": "linear"}, "train.scheduler: must be one of"),
        ({"scheduler_step_size": 0}, "train.scheduler_step_size: must be > 0"),
        ({"scheduler_gamma": -0.5}, "train.scheduler_gamma: must be > 0"),
        ({"scheduler_epochs": 0}, "train.scheduler_epochs: must be > 0"),
        ({"scheduler_min_lr": -1e-5}, "train.scheduler_min_lr: must be in"),
        ({"scheduler_min_lr": 1.0}, "train.scheduler_min_lr: must be in"),
    ],
)
def test_bad_schedule_fields_are_one_line_errors(train, fragment):
    with pytest.raises(UserError, match=fragment) as error:
        ExperimentConfig.from_dict({"train": train})
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("command", "setting", "fragment"),
    [
        (["-m", "relif_ray.cli", "sweep", "--dataset", "nyuv2"], "train.scheduler=linear",
         "--set: config field train.scheduler: must be one of ['none', 'step', 'cosine'], "
         "got 'linear'"),
        (["sweeps/nyuv2.py"], "train.scheduler_gamma=-0.5",
         "--set: config field train.scheduler_gamma: must be > 0, got -0.5"),
    ],
    ids=["relif-sweep-unknown-scheduler", "sweeps-nyuv2-negative-gamma"],
)  # fmt: skip
@pytest.mark.slow
def test_the_sweep_commands_reject_a_bad_schedule_before_ray_starts(
    tmp_path, command, setting, fragment
):
    """Through the real commands (`relif sweep`, sweeps/nyuv2.py): exit 2, one line on
    stderr, no traceback, nothing written (the demo data included)."""
    argv = [*command, "--demo", "--set", setting, "--storage", str(tmp_path / "results")]
    result = subprocess.run(
        [sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert fragment in result.stderr and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written
