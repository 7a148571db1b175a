"""A trial's config as Ray Tune holds it, and the ExperimentConfig it stands for (no Ray import).

A trial's Tune config is the resolved config that runs, as flat dotted keys (`relif.enabled`,
`seed`, `method.name`, ... every ExperimentConfig field, see `relif_ray.config.flat_config`)
plus "label" and the sweep's "delta" (+ "study" for Optuna trials, + "experiment_dir" where the
squash constants live, + "reference_error" when a trial's ERM reference errored, + the
test-only "fault_injection_step"), so Tune's tools (ExperimentAnalysis, W&B, MLflow) show what
ran. It is the sweep's constants (`sweep_constants`: the shared base config, flat, and delta)
merged with the trial's own part (`trial_overrides`: label, seed and the variant's overrides,
`relif_ray.sweep.labels`); `experiment_config` builds the trial's ExperimentConfig from it.
"""

from __future__ import annotations

import copy
from typing import Any

from relif_ray.config import ExperimentConfig, flat_config, nested_config


def apply_overrides(values: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of the config dict `values` with dotted fields set, e.g. `relif.r_star`."""
    result = copy.deepcopy(values)
    for dotted, value in overrides.items():
        section, _, field = dotted.rpartition(".")
        target = result
        for key in filter(None, section.split(".")):
            target = target.setdefault(key, {})
        target[field] = value
    return result


def sweep_constants(base: dict[str, Any], delta: float) -> dict[str, Any]:
    """The part of the Tune config every trial of a sweep shares: the base ExperimentConfig,
    completed with the defaults of the fields it leaves out, as flat dotted keys, and the live
    audit's delta."""
    return {**flat_config(ExperimentConfig.from_dict(base).to_dict()), "delta": float(delta)}


def trial_overrides(item: dict[str, Any], seed: int) -> dict[str, Any]:
    """A trial's own part of its Tune config: label, seed and the variant's overrides."""
    return {"label": item["label"], "seed": int(seed), **item["overrides"]}


def experiment_config(tune_config: dict[str, Any]) -> ExperimentConfig:
    """The validated ExperimentConfig of one trial's (flat) Tune config: the one place a
    trial's config is built."""
    return ExperimentConfig.from_dict(nested_config(tune_config))
