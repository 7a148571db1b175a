"""The Ray Tune layer: a Trainable around the engine, the sweep grid, and the launcher.

This is the only module of the library that imports Ray. One trial = one `TrainingRun`; one
Tune iteration = one epoch followed by a validation pass. Checkpoints hold the engine state
(model, optimiser, method, ReLiF controller, step, RNG); the final checkpoint also holds the
trial's outputs (see `relif_ray.outputs`), so the experiment directory in storage is all that
analysis needs.

A trial's Tune config is {"variant": {"label", "overrides"}, "seed", "base"}: `base` is the
shared ExperimentConfig dict, `overrides` are dotted-field values of this variant (e.g.
{"method.name": "erm", "relif.enabled": True, "relif.r_star": 0.24}) and `seed` its seed.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune

from relif_ray.config import ExperimentConfig
from relif_ray.engine import TrainingRun
from relif_ray.errors import UserError
from relif_ray.outputs import write_trial_outputs

STATE_FILE = "state.pt"
EVAL_SPLITS = ("val", "test")


def experiment_config(tune_config: dict[str, Any]) -> ExperimentConfig:
    """The ExperimentConfig of one trial: base, then the variant's overrides, then the seed."""
    values = copy.deepcopy(tune_config["base"])
    for dotted, value in tune_config["variant"]["overrides"].items():
        section, _, field = dotted.rpartition(".")
        target = values
        for key in filter(None, section.split(".")):
            target = target.setdefault(key, {})
        target[field] = value
    values["seed"] = int(tune_config["seed"])
    return ExperimentConfig.from_dict(values)


def variant(label: str, r_star: float | None = None, eta: float | None = None) -> dict[str, Any]:
    """A sweep variant from a method label: `erm`, `pcgrad`, `relif` (= ERM + ReLiF) or
    `<method>+relif`; ReLiF variants take the controller target r* and step size eta."""
    method, plus, suffix = label.partition("+")
    if plus and suffix != "relif":
        raise UserError(f"--methods: cannot parse '{label}' (expected <method> or <method>+relif)")
    relif = label == "relif" or bool(plus)
    overrides: dict[str, Any] = {"method.name": "erm" if label == "relif" else method}
    overrides["relif.enabled"] = relif
    if relif:
        if r_star is not None:
            overrides["relif.r_star"] = r_star
        if eta is not None:
            overrides["relif.eta"] = eta
    return {"label": label, "overrides": overrides}


def grid_variants(labels: list[str], r_stars: list[float], etas: list[float]) -> list[dict]:
    """ReLiF labels are crossed with every (r*, eta); other methods appear once."""
    variants = []
    for label in labels:
        if label == "relif" or label.endswith("+relif"):
            variants += [variant(label, r, e) for r in r_stars for e in etas]
        else:
            variants.append(variant(label))
    return variants


class ReLiFTrainable(tune.Trainable):
    """One trial: `step()` trains one epoch and validates; checkpoints carry the engine state."""

    def setup(self, config: dict[str, Any]) -> None:
        cpus = self.trial_resources.required_resources.get("CPU", 1)
        torch.set_num_threads(max(1, int(cpus)))
        self.label = config["variant"]["label"]
        self.run = TrainingRun(experiment_config(config))
        self.last_eval = None

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.setup(new_config)
        return True

    def step(self) -> dict[str, Any]:
        self.run.train_epoch()
        self.last_eval = self.run.evaluate("val")
        metrics = {f"val_{key}": value for key, value in self.last_eval.metrics.items()}
        return {
            **metrics,
            "worst": self.last_eval.metrics["worst"],
            "macro": self.last_eval.metrics["macro"],
            "epoch": self.run.epoch,
            "train_step": self.run.step,
            "done": self.run.finished,
        }

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        torch.save(self.run.state_dict(), Path(checkpoint_dir) / STATE_FILE)
        if self.run.finished:
            self._write_outputs(Path(checkpoint_dir))

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        state = torch.load(Path(checkpoint_dir) / STATE_FILE, weights_only=True)
        self.run.load_state_dict(state)

    def _write_outputs(self, directory: Path) -> None:
        splits = {
            name: self.last_eval if name == "val" and self.last_eval else self.run.evaluate(name)
            for name in EVAL_SPLITS
            if name in self.run.problem.splits
        }
        config = self.run.config
        info = {
            "trial_id": self.trial_id,
            "label": self.label,
            "method": config.method.name,
            "relif": config.relif.enabled,
            "seed": config.seed,
            "steps": self.run.step,
            "status": "completed",
            "config": config.to_dict(),
        }
        write_trial_outputs(directory, info, splits, self.run.trace)


def param_space(base: dict[str, Any], variants: list[dict], seeds: list[int]) -> dict[str, Any]:
    """The Tune search space: every variant crossed with every seed."""
    return {
        "variant": tune.grid_search(variants),
        "seed": tune.grid_search(seeds),
        "base": base,
    }


def run_sweep(
    space: dict[str, Any],
    *,
    name: str,
    storage: str,
    num_cpus: int | None = None,
    num_gpus: float = 0,
    cpus_per_trial: float = 1,
    gpus_per_trial: float = 0,
    address: str | None = None,
    max_failures: int = 2,
    resume: bool = False,
) -> Path:
    """Run (or resume) one sweep on local Ray or an existing cluster; return the experiment dir."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    storage_path = storage if "://" in storage else str(Path(storage).resolve())
    experiment_dir = Path(storage_path) / name
    if not ray.is_initialized():
        if address:
            ray.init(address=address, include_dashboard=False)
        else:
            ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False)
    trainable = tune.with_resources(ReLiFTrainable, {"cpu": cpus_per_trial, "gpu": gpus_per_trial})
    if resume:
        if not tune.Tuner.can_restore(str(experiment_dir)):
            raise UserError(f"--resume: no experiment to resume at {experiment_dir}")
        tuner = tune.Tuner.restore(str(experiment_dir), trainable, resume_errored=True)
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=space,
            tune_config=tune.TuneConfig(reuse_actors=True),
            run_config=tune.RunConfig(
                name=name,
                storage_path=storage_path,
                checkpoint_config=tune.CheckpointConfig(
                    checkpoint_frequency=1, checkpoint_at_end=True, num_to_keep=2
                ),
                failure_config=tune.FailureConfig(max_failures=max_failures),
                verbose=1,
            ),
        )
    tuner.fit()
    return experiment_dir
