"""What Ray Tune is handed for a sweep, pinned: the parameter space every trial shares and the
trials in the order the searcher hands them out (with the first suggestions of the Optuna
studies), for the demo, a grid with overrides, an Optuna sweep and a 2-GPU sweep, each read
from the real command line through the driver to `tune.Tuner`. A change to how a trial's
config travels must leave these bytes as they are (`tune_form.json`; regenerate it only for a
change that means to alter Tune's form, with RELIF_WRITE_TUNE_FORM=1).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from relif_ray.cli.sweep import run
from relif_ray.tuning import cluster

EXPECTED = Path(__file__).with_name("tune_form.json")

SWEEPS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "demo": (("--demo",), {"datasets": ("nyuv2",), "controller_checks": False}),
    "grid": (
        (
            "--demo",
            "--methods",
            "erm,relif,pcgrad,relif-static",
            "--seeds",
            "0,1",
            "--r-star",
            "0.2,0.25",
            "--eta",
            "1e-3",
            "--set",
            "train.lr=0.02",
            "--config",
            "{config}",
            "--scheduler",
            "asha",
            "--delta",
            "0.15",
        ),
        {"datasets": ("nyuv2",), "controller_checks": False},
    ),
    "optuna": (
        ("--demo", "--methods", "relif", "--search", "optuna", "--num-samples", "2"),
        {"datasets": ("nyuv2",), "controller_checks": False},
    ),
    "two_gpus": (
        ("--demo", "--num-gpus", "2", "--methods", "erm,relif", "--seeds", "0,1,2"),
        {"datasets": ("nyuv2",), "controller_checks": False},
    ),
}


class Handed(Exception):
    """Raised by the stand-in Tuner once it has what Tune would be handed."""

    def __init__(self, form: dict[str, Any]) -> None:
        super().__init__("handed to Tune")
        self.form = form


class HandedTuner:
    """`tune.Tuner` as a recorder: no sweep exists yet, and building one records its form."""

    @staticmethod
    def can_restore(*args: Any, **kwargs: Any) -> bool:
        return False

    def __init__(self, trainable: Any, *, param_space: dict, tune_config: Any, **_: Any) -> None:
        order = tune_config.search_alg
        order.set_search_properties(None, None, param_space)
        suggestions = [order.suggest(f"trial{number}") for number in range(6)]
        for number in range(6):  # references finish (one errors): their trials follow
            order.on_trial_complete(f"trial{number}", REFERENCE_RESULT, error=number == 1)
        suggestions += [order.suggest(f"trial{number}") for number in range(6, 12)]
        raise Handed(
            {
                "param_space": param_space,
                "items": order._items,
                "suggestions": suggestions,
                "num_samples": tune_config.num_samples,
                "max_concurrent_trials": tune_config.max_concurrent_trials,
            }
        )


def tune_form(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The JSON of what the sweep `name` hands Tune, its folders written as placeholders."""
    import ray
    from ray import tune

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": CLUSTER}])
    monkeypatch.setattr(ray, "cluster_resources", lambda: CLUSTER)
    monkeypatch.setattr(cluster, "check_gpu_stack", lambda: None)  # no real GPU node to query
    monkeypatch.setattr(tune, "Tuner", HandedTuner)
    config = tmp_path / "base.yaml"
    config.write_text("train:\n  batch_size: 4\nrelif:\n  warmup_steps: 3\n")
    flags, where = SWEEPS[name]
    storage = tmp_path / "results"
    argv = [flag.format(config=config) for flag in flags] + ["--storage", str(storage)]
    with pytest.raises(Handed) as handed:
        run(argv, prog=name, **where)
    text = json.dumps(handed.value.form, indent=1, default=repr)  # key order kept, as Tune has it
    return text.replace(str(storage), "<storage>").replace(str(tmp_path), "<tmp>")


REFERENCE_RESULT = {"squash_constants/depth": [0.5, 2.0], "squash_constants/normal": [0.1, 0.9]}
"""The last result of a finished ERM reference trial, as the trial order reads it."""

CLUSTER = {"CPU": 8.0, "GPU": 2.0}
"""The stand-in cluster: one node."""


@pytest.mark.parametrize("name", list(SWEEPS))
def test_tune_is_handed_the_pinned_form(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    form = tune_form(name, tmp_path, monkeypatch)
    expected = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}
    if os.environ.get("RELIF_WRITE_TUNE_FORM"):
        expected[name] = form
        EXPECTED.write_text(json.dumps(expected, sort_keys=True, indent=1) + "\n")
    assert form == expected[name]
