"""Pinned numbers: one short CPU trial of each method on NYUv2 and one clinical trial.

The values in `pinned_numbers.json` were produced by this very code path; a refactoring must
reproduce them bit for bit (the same config and seed give the same floats on CPU). A change that
alters numbers on purpose regenerates the file in its own commit and says why:
(ReLiF trials on NYUv2 use the paper's squash, with the pinned ERM run's validation q10/q90.)

    .venv/bin/python -m tests.test_pinned_numbers --write
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from relif_ray.experiment.outputs import EvalResult

PINS = Path(__file__).with_name("pinned_numbers.json")
NYUV2_LABELS = ["erm", "uncertainty", "gradnorm", "pcgrad", "fairgrad", "relif", "pcgrad+relif"]
CLINICAL_LABEL = "relif"


def _trial(base: dict, label: str) -> tuple[dict, EvalResult]:
    """Trace, validation metrics and summed audit scores of one short trial of `label`, and
    its validation result."""
    from relif_ray.engine import TrainingRun
    from relif_ray.sweep.labels import experiment_config, sweep_constants, trial_overrides, variant

    trial = {**sweep_constants(base, 0.2), **trial_overrides(variant(label), 0)}
    run = TrainingRun(experiment_config(trial))
    while not run.finished:
        run.train_epoch()
    result = run.evaluate("val")
    scores = result.scores.groupby("task")["score"].sum()
    numbers = {
        "trace": run.trace,
        "val": {key: float(value) for key, value in result.metrics.items()},
        "val_score_sums": {task: float(total) for task, total in scores.items()},
    }
    return numbers, result


def _nyuv2_base(root: Path) -> dict:
    from tests.conftest import tiny_config

    base = tiny_config(root, epochs=1, max_steps=3)
    base["relif"] = {"warmup_steps": 1}  # squash constants: the pinned ERM run's
    return base


def _clinical_base(root: Path) -> dict:
    return {
        "seed": 0,
        "data": {"dataset": "mimic3", "root": str(root)},
        "model": {"hidden_size": 16, "num_layers": 2},
        "train": {"epochs": 1, "max_steps": 3, "batch_size": 8, "optimizer": "adamw"},
        "relif": {"warmup_steps": 1},
    }


def compute(workdir: Path) -> dict:
    """Every pinned number, computed afresh on data written into `workdir`."""
    import torch

    from relif_ray.data.synthetic_mimic3 import write_synthetic_mimic3
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
    from tests.conftest import TINY_DATA

    torch.set_num_threads(1)
    nyuv2 = write_synthetic_nyuv2(workdir / "nyuv2", seed=0, **TINY_DATA)
    mimic3 = write_synthetic_mimic3(workdir / "mimic3", patients=40, seed=0)
    base = _nyuv2_base(nyuv2)
    pins, results = {}, {}
    for label in NYUV2_LABELS:  # erm first: its validation run gives ReLiF's squash constants
        pins[f"nyuv2/{label}"], results[label] = _trial(base, label)
        base["relif"]["squash_constants"] = results["erm"].squash_constants(["depth", "normal"])
    pins[f"mimic3/{CLINICAL_LABEL}"] = _trial(_clinical_base(mimic3), CLINICAL_LABEL)[0]
    return pins


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.fixture(scope="module")
def computed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return compute(tmp_path_factory.mktemp("pins"))


@pytest.mark.parametrize("key", [f"nyuv2/{x}" for x in NYUV2_LABELS] + ["mimic3/relif"])
def test_numbers_are_bit_identical_to_the_pins(computed: dict, key: str) -> None:
    pinned = json.loads(PINS.read_text())[key]
    assert pinned["trace"], "a pinned trial trains at least one step"
    assert _same(computed[key], pinned), f"{key} differs from {PINS.name}"


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.test_pinned_numbers --write")
    with tempfile.TemporaryDirectory() as workdir:
        PINS.write_text(json.dumps(compute(Path(workdir)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {PINS}")
