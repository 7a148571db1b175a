"""What a sweep will run, decided and checked before Ray starts (no Ray import).

The resources a sweep may use and each trial asks for (`Resources`), the grid of trial configs
(`param_space`, a `SweepSpace`), the Optuna studies (`OptunaPlan`) and the paper's controller checks
(`controller_variants`). `relif_ray.tuning` turns these into a Ray Tune run; a trial's Tune
config is described in `relif_ray.variants`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from relif_ray.variants import (
    experiment_config,
    grid_variants,
    sweep_constants,
    trial_overrides,
    unique_variants,
    variant,
)

# The defaults of the paper's controller checks (appendix "Controller sensitivity"): eta at
# one r*, r* from 0.16 to 0.28 in steps of 0.02 at one eta, and the static-lambda grid.
CONTROLLER_ETAS = "1e-4,1e-3,1e-2"
CONTROLLER_R_STARS = ",".join(f"{0.16 + 0.02 * i:g}" for i in range(7))
STATIC_LAMBDAS = "0.01,0.03,0.1,0.3,1.0"


@dataclass(frozen=True)
class Resources:
    """What the sweep may use and what each trial asks for.

    num_gpus: GPUs the sweep may use in total; with gpus_per_trial it caps concurrency at
        floor(num_gpus / gpus_per_trial) (8 and 0.5 -> 16 trials at once).
    num_cpus: CPUs of the local Ray instance (None = all); ignored with `address`.
    address: an existing Ray cluster ("auto" or "HEAD_IP:6379"); None starts local Ray, which
        detects the machine's real GPUs.
    """

    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    num_gpus: float = 0.0
    num_cpus: int | None = None
    address: str | None = None

    @property
    def max_concurrent_trials(self) -> int | None:
        if self.gpus_per_trial <= 0:
            return None
        return max(1, math.floor(self.num_gpus / self.gpus_per_trial + 1e-9))


@dataclass
class SweepSpace:
    """What Tune runs: `constants` (Tune's param_space, shared by every trial: the base config
    as flat dotted keys and delta) and `trials`, each trial's own part of its config (label,
    seed, the variant's overrides) in the order the searcher hands them out (empty for Optuna,
    whose studies suggest them). Merged, they are the resolved config that runs
    (`relif_ray.variants`)."""

    constants: dict[str, Any]
    trials: list[dict[str, Any]] = field(default_factory=list)


SCHEDULER_METRICS: dict[str, str] = {"worst": "max", "macro": "max", "val_bias": "min"}
"""What `--scheduler asha` may rank trials by, with its mode: validation Worst or Macro
(higher is better) or the live validation Bias (lower is better)."""

LOGGER_CALLBACKS = {"wandb": "wandb", "mlflow": "mlflow"}
"""`--callbacks` name -> the package Ray's integration needs (the extra of the same name)."""


@dataclass(frozen=True)
class TuneOptions:
    """How Tune schedules and logs the trials.

    scheduler: "fifo" (every trial runs its whole budget) or "asha" (asynchronous successive
        halving on `scheduler_metric` per epoch; same-seed ERM reference trials are never
        stopped, see `relif_ray.tuning.integrations`).
    asha_max_epochs: ASHA's max_t (the trials' epochs; None when the budget is steps only).
    max_concurrent_trials: at most this many trials at once (None: as resources allow).
    callbacks: Ray's logger integrations to add ("wandb", "mlflow"); TensorBoard and CSV/JSON
        are always written by Ray's default loggers.
    """

    scheduler: str = "fifo"
    scheduler_metric: str = "worst"
    asha_grace_epochs: int = 1
    asha_reduction_factor: float = 3.0
    asha_max_epochs: int | None = None
    max_concurrent_trials: int | None = None
    callbacks: tuple[str, ...] = ()


def check_variants(base: dict[str, Any], variants: list[dict]) -> None:
    """Build every trial's config once before Ray starts, so no trial fails on a bad value."""
    constants = sweep_constants(base, 0.0)
    for item in variants:
        experiment_config({**constants, **trial_overrides(item, 0)})


def param_space(
    base: dict[str, Any], variants: list[dict], seeds: list[int], delta: float
) -> SweepSpace:
    """The grid: every variant crossed with every seed (variant-major), each variant's config
    checked first."""
    check_variants(base, variants)
    trials = [trial_overrides(item, seed) for item in variants for seed in seeds]
    return SweepSpace(sweep_constants(base, delta), trials)


@dataclass(frozen=True)
class OptunaPlan:
    """Multi-objective Optuna over (r*, eta): one study per ReLiF label and seed, each with
    `num_samples` trials; r* uniform and eta log-uniform in the given closed ranges."""

    labels: list[str]
    seeds: list[int]
    num_samples: int
    r_star_range: tuple[float, float]
    eta_range: tuple[float, float]

    @property
    def total_trials(self) -> int:
        return self.num_samples * len(self.labels) * len(self.seeds)

    def space(self, base: dict[str, Any], delta: float) -> SweepSpace:
        """The constant part of every trial's config (the studies suggest the rest), after
        checking the corners of the search ranges for every label."""
        corners = grid_variants(self.labels, list(self.r_star_range), list(self.eta_range))
        check_variants(base, corners)
        return SweepSpace(sweep_constants(base, delta))


def controller_variants(
    eta_r_star: float,
    etas: list[float],
    r_stars: list[float],
    r_star_eta: float,
    static_lambdas: list[float],
) -> list[dict]:
    """The paper's controller checks (appendix "Controller sensitivity", section 5):
    eta in `etas` at r* = `eta_r_star`; r* in `r_stars` at eta = `r_star_eta`; lambda fixed at
    each of `static_lambdas` ("relif-static"); plus ERM, the same-seed reference the audit
    squashes NYUv2 scores with. A setting in two checks is trained once."""
    variants = [variant("erm")]
    variants += [variant("relif", eta_r_star, eta) for eta in etas]
    variants += [variant("relif", r_star, r_star_eta) for r_star in r_stars]
    variants += [
        variant("relif-static", extra={"relif.lambda0": value}) for value in static_lambdas
    ]
    return unique_variants(variants)
