"""Shared fixtures: tiny NYUv2-format data, tiny configs, one Ray session per test session."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# One thread, as in a 1-CPU Ray trial: the same float reductions, and no oversubscription
# of a 2-core machine while Ray workers run beside the test process.
torch.set_num_threads(1)

TINY_DATA = {"train": 24, "val": 12, "height": 32, "width": 40}
TINY_ERM_SQUASH = {"depth": [4.8131, 4.9289], "normal": [3.9598, 4.0494]}
"""q10/q90 (rounded) of the validation depth/normal scores of the ERM run of `tiny_config` on
the tiny data (seed 0, 2 epochs): the paper's squash constants for ReLiF runs in tests."""


def tiny_config(root: str | Path, **train: object) -> dict:
    """An ExperimentConfig dict for fast CPU runs on the tiny synthetic data."""
    return {
        "seed": 0,
        "data": {"dataset": "nyuv2", "root": str(root)},
        "model": {"backbone": "resnet18", "head_channels": 16},
        "train": {"epochs": 2, "batch_size": 6, "eval_batch_size": 12, "lr": 1e-3, **train},
        "relif": {"squash_constants": TINY_ERM_SQUASH},
    }


@pytest.fixture(scope="session")
def nyuv2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny synthetic NYUv2 data set in the real on-disk layout, written once per session."""
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2

    root = tmp_path_factory.mktemp("nyuv2") / "data"
    return write_synthetic_nyuv2(root, seed=0, **TINY_DATA)


@pytest.fixture(scope="session")
def ray_session():
    """Local Ray with 2 CPUs and 2 logical GPUs (for fractional-GPU packing; trials still run
    on the CPU), no dashboard, started once for all sweep tests."""
    import ray

    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def small_data(tmp_path_factory) -> Path:
    """12 train / 6 val images of 32x40 and a test split (a copy of val), so outputs cover val
    AND test; with batch 6 an epoch is 2 steps."""
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2

    sizes = {**TINY_DATA, "train": 12, "val": 6}
    root = write_synthetic_nyuv2(tmp_path_factory.mktemp("small") / "data", seed=0, **sizes)
    shutil.copytree(root / "val", root / "test")
    return root
