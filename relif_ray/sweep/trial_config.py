"""A trial of a sweep as the plan holds it (`TrialSpec`, over the sweep's typed base
`ExperimentConfig`), and the one conversion to and from the config Ray Tune holds (no Ray
import).

From the command line to the trial a config keeps one shape: the base config is an
`ExperimentConfig` (`relif_ray.sweep.compose`), each trial a `TrialSpec` (label, seed, the
variant's overrides), and `TrialSpec.config` their resolved ExperimentConfig. Only Tune needs
another: a trial's Tune config is that resolved config as flat dotted keys (`relif.enabled`,
`seed`, `method.name`, ... every ExperimentConfig field, `relif_ray.config.flat_config`) plus
"label" and the sweep's "delta" (+ "study" for Optuna trials, + "experiment_dir" where the
squash constants live, + "reference_error" when a trial's ERM reference errored, + the
test-only "fault_injection_step"), so Tune's tools (ExperimentAnalysis, W&B, MLflow) show what
ran. `tune_constants` and `tune_trial` make it (Tune merges the two), `experiment_config` reads
it back in the trial.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from relif_ray.config import ExperimentConfig, flat_config, nested_config


@dataclass(frozen=True)
class TrialSpec:
    """One trial of a sweep before Tune: its label, seed and the variant's overrides (dotted
    ExperimentConfig fields, `relif_ray.sweep.labels.variant`) of the sweep's base config.

    tune: keys its Tune config carries that are not config fields: "study" (the Optuna study
        that suggested it) and the test-only "fault_injection_step".
    """

    label: str
    seed: int
    overrides: dict[str, Any] = field(default_factory=dict)
    tune: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, item: dict[str, Any], seed: int, **tune: Any) -> TrialSpec:
        """The trial of a variant (`relif_ray.sweep.labels.variant`: label and overrides)."""
        return cls(item["label"], int(seed), dict(item["overrides"]), tune)

    def config(self, base: ExperimentConfig) -> ExperimentConfig:
        """The validated ExperimentConfig this trial runs: `base` with its overrides and seed."""
        values = apply_overrides(base.to_dict(), {**self.overrides, "seed": self.seed})
        return ExperimentConfig.from_dict(values)


def apply_overrides(values: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of the config dict `values` with dotted fields set, e.g. `relif.r_star`."""
    result = copy.deepcopy(values)
    for dotted, value in overrides.items():
        section, _, field_name = dotted.rpartition(".")
        target = result
        for key in filter(None, section.split(".")):
            target = target.setdefault(key, {})
        target[field_name] = value
    return result


def tune_constants(base: ExperimentConfig, delta: float) -> dict[str, Any]:
    """The part of the Tune config every trial of a sweep shares: the base config as flat
    dotted keys and the live audit's delta."""
    return {**flat_config(base.to_dict()), "delta": float(delta)}


def tune_trial(trial: TrialSpec) -> dict[str, Any]:
    """A trial's own part of its Tune config: label, seed, the variant's overrides and its
    Tune-only keys."""
    return {"label": trial.label, "seed": trial.seed, **trial.overrides, **trial.tune}


def experiment_config(tune_config: dict[str, Any]) -> ExperimentConfig:
    """The validated ExperimentConfig of one trial's (flat) Tune config: the one place a
    trial's config is read back from Tune."""
    return ExperimentConfig.from_dict(nested_config(tune_config))
