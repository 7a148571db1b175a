"""A trial of a sweep as the plan holds it (`TrialSpec`, over the sweep's typed base
`ExperimentConfig`), the keys its Tune config carries besides its config (`TuneKeys`), and the
one conversion to and from the config Ray Tune holds (no Ray import).

From the command line to the trial a config keeps one shape: the base config is an
`ExperimentConfig` (`relif_ray.sweep.compose`), each trial a `TrialSpec` (label, seed, the
variant's overrides), and `TrialSpec.config` their resolved ExperimentConfig. Only Tune needs
another: a trial's Tune config is that resolved config as flat dotted keys (`relif.enabled`,
`seed`, `method.name`, ... every ExperimentConfig field, `relif_ray.config.flat_config`) plus
the Tune-only keys of `TuneKeys` (label, the sweep's delta, ...), so Tune's tools
(ExperimentAnalysis, W&B, MLflow) show what ran. `tune_constants` and `tune_trial` make it
(Tune merges the two), `experiment_config` and `TuneKeys.of` read it back in the trial: no
other module writes or reads a Tune-only key by name.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, replace
from typing import Any

from relif_ray.config import ExperimentConfig, flat_config, nested_config


@dataclass(frozen=True)
class TuneKeys:
    """The keys of a trial's Tune config that are not ExperimentConfig fields (None: not set;
    a sweep's shared ones and a trial's own are merged by Tune, `tune_constants`, `tune_trial`).

    label: the trial's variant (`relif_ray.sweep.labels`); seed: its config's seed, repeated
        in its own part (what Tune's searcher hands out names its seed);
    delta: the live validation audit's delta;
    study: the Optuna study that suggested the trial (`relif_ray.tuning.search`);
    fault_injection_step: test-only, the training step at which the trial fails once;
    timing_dir: where a timing Trainable of the benchmarks writes its records;
    outputs_at_iterations: the epochs at which the trial writes its outputs (ASHA's rungs,
        where it may be stopped: `relif_ray.tuning.integrations`);
    experiment_dir: the experiment, where the squash constants live;
    reference_error: why the ERM reference the trial waits for errored (it then fails at set-up).
    fused_seeds: the seeds of a trial that trains several as one model (`train.fused_seeds`),
        its config's seed first; empty for a trial of one seed.
    """

    label: str | None = None
    seed: int | None = None
    delta: float | None = None
    study: str | None = None
    fault_injection_step: int | None = None
    timing_dir: str | None = None
    outputs_at_iterations: tuple[int, ...] = ()
    experiment_dir: str | None = None
    reference_error: str | None = None
    fused_seeds: tuple[int, ...] = ()

    def tune(self) -> dict[str, Any]:
        """The keys as Tune holds them: those set, in this order (a tuple as a list)."""
        values = {key.name: getattr(self, key.name) for key in fields(self)}
        values["outputs_at_iterations"] = list(self.outputs_at_iterations) or None
        values["fused_seeds"] = list(self.fused_seeds) or None
        return {key: value for key, value in values.items() if value is not None}

    @classmethod
    def of(cls, tune_config: dict[str, Any]) -> TuneKeys:
        """The keys of a (flat) Tune config; those it lacks are not set."""
        values = {key.name: tune_config.get(key.name) for key in fields(cls)}
        values["outputs_at_iterations"] = tuple(values["outputs_at_iterations"] or ())
        values["fused_seeds"] = tuple(values["fused_seeds"] or ())
        return cls(**values)

    @property
    def seeds(self) -> tuple[int, ...]:
        """The seeds the trial trains: its fused seeds, else its one seed."""
        return self.fused_seeds or (() if self.seed is None else (self.seed,))


@dataclass(frozen=True)
class TrialSpec:
    """One trial of a sweep before Tune: its label, seed and the variant's overrides (dotted
    ExperimentConfig fields, `relif_ray.sweep.labels.variant`) of the sweep's base config.

    study, fault_injection_step, fused_seeds: its own Tune-only keys (`TuneKeys`); with
    fused_seeds, `seed` is the first of them.
    """

    label: str
    seed: int
    overrides: dict[str, Any] = field(default_factory=dict)
    study: str | None = None
    fault_injection_step: int | None = None
    fused_seeds: tuple[int, ...] = ()

    @property
    def seeds(self) -> tuple[int, ...]:
        """The seeds the trial trains (`TuneKeys.seeds`)."""
        return self.fused_seeds or (self.seed,)

    def seed_configs(self, base: ExperimentConfig) -> list[ExperimentConfig]:
        """The config of each seed the trial trains, in its order."""
        return seed_configs(self.config(base), self.fused_seeds)

    @classmethod
    def of(cls, item: dict[str, Any], seed: int, **keys: Any) -> TrialSpec:
        """The trial of a variant (`relif_ray.sweep.labels.variant`: label and overrides)."""
        return cls(item["label"], int(seed), dict(item["overrides"]), **keys)

    def config(self, base: ExperimentConfig) -> ExperimentConfig:
        """The validated ExperimentConfig this trial runs: `base` with its overrides and seed."""
        return with_fields(base, {**self.overrides, "seed": self.seed})


def seed_configs(config: ExperimentConfig, fused_seeds: tuple[int, ...]) -> list[ExperimentConfig]:
    """The configs of a trial's seeds: `config` itself, or one per fused seed."""
    if not fused_seeds:
        return [config]
    return [with_fields(config, {"seed": seed}) for seed in fused_seeds]


def with_fields(config: ExperimentConfig, fields: dict[str, Any]) -> ExperimentConfig:
    """`config` with dotted fields set (`relif.r_star`, ...; a section's name sets it whole),
    validated: how every override reaches a typed config, once (a variant's settings, and the
    layers of the sweep's base config: --config, --set, the flags; `relif_ray.sweep.compose`)."""
    if not fields:
        return config
    return ExperimentConfig.from_dict(apply_overrides(config.to_dict(), fields))


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


def tune_constants(
    base: ExperimentConfig, delta: float, shared: TuneKeys | None = None
) -> dict[str, Any]:
    """The part of the Tune config every trial of a sweep shares: the base config as flat
    dotted keys, the live audit's delta and the sweep's other `shared` keys."""
    keys = replace(shared or TuneKeys(), delta=float(delta))
    return {**flat_config(base.to_dict()), **keys.tune()}


def tune_trial(trial: TrialSpec) -> dict[str, Any]:
    """A trial's own part of its Tune config: label, seed, the variant's overrides and its
    Tune-only keys."""
    own = TuneKeys(
        study=trial.study,
        fault_injection_step=trial.fault_injection_step,
        fused_seeds=trial.fused_seeds,
    )
    return {**TuneKeys(trial.label, trial.seed).tune(), **trial.overrides, **own.tune()}


def with_reference_error(tune_config: dict[str, Any], reason: str) -> dict[str, Any]:
    """A trial's own part of its Tune config, with why the reference it waits for errored."""
    return {**tune_config, **TuneKeys(reference_error=reason).tune()}


def experiment_config(tune_config: dict[str, Any]) -> ExperimentConfig:
    """The validated ExperimentConfig of one trial's (flat) Tune config: the one place a
    trial's config is read back from Tune (its other keys: `TuneKeys.of`)."""
    return ExperimentConfig.from_dict(nested_config(tune_config))
