"""What a sweep will run, decided and checked before Ray starts (no Ray import).

The resources a sweep may use and each trial asks for (`Resources`), the grid of trial configs
(`param_space`), an explicit list of (variant, seed) trials at settings selected per seed
(`selected_trials`, `trial_list_space`), the Optuna studies (`OptunaPlan`), the paper's
controller checks (`controller_variants`), and the order Tune gets the trials in
(`trial_order`: same-seed ERM reference trials before the ReLiF trials that train on their
squash constants). `relif_ray.tuning` turns these into a Ray Tune run; a trial's Tune config
is described in `relif_ray.variants`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product
from typing import Any

from relif_ray.config import ExperimentConfig
from relif_ray.errors import UserError
from relif_ray.preflight import check_trial_configs
from relif_ray.problems import benchmark
from relif_ray.variants import (
    experiment_config,
    grid_variants,
    unique_variants,
    uses_controller,
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


def check_variants(base: dict[str, Any], variants: list[dict]) -> None:
    """Build every trial's config once before Ray starts, then its method and model
    (`relif_ray.preflight`), so no trial fails on a bad value or option."""
    check_trial_configs(
        [experiment_config({"base": base, "variant": item, "seed": 0}) for item in variants]
    )


def param_space(
    base: dict[str, Any],
    variants: list[dict],
    seeds: list[int],
    delta: float,
    fault_injection_step: int | None = None,
) -> dict[str, Any]:
    """The grid: every variant crossed with every seed, each variant's config checked first.

    `{"grid_search": values}` is Ray Tune's grid-search spec (what `tune.grid_search` returns).
    fault_injection_step (tests only): every trial raises `InjectedFault` once when it reaches
    this training step, unless restored from a checkpoint; put it after the first epoch, or
    the retry has no checkpoint to restore and fails again.
    """
    check_variants(base, variants)
    space = {
        "variant": {"grid_search": variants},
        "seed": {"grid_search": seeds},
        "base": base,
        "delta": delta,
    }
    if fault_injection_step is not None:
        if not isinstance(fault_injection_step, int) or fault_injection_step < 0:
            raise UserError(
                "fault_injection_step: must be a non-negative integer, "
                f"got {fault_injection_step!r}"
            )
        space["fault_injection_step"] = fault_injection_step
    return space


def selected_trials(
    labels: list[str],
    seeds: list[int],
    settings: dict[tuple[str, int], tuple[float, float]],
    source: str,
) -> list[dict]:
    """The sweep's trials as an explicit list of {"variant", "seed"} entries: each label with
    each seed, a label whose controller uses (r*, eta) at the (r*, eta) selected for that seed
    (`settings`: (label, seed) -> (r*, eta), chosen from the Optuna search `source`), every
    other label as it is."""
    studied = {label for label, _ in settings}
    trials = []
    for label in labels:
        for seed in seeds:
            if not uses_controller(label):
                trials.append({"variant": variant(label), "seed": seed})
                continue
            if label not in studied:
                raise UserError(
                    f"--select-from {source}: no study of '{label}' "
                    f"(studied: {', '.join(sorted(studied)) or 'none'})"
                )
            if (label, seed) not in settings:
                raise UserError(f"--select-from {source}: no study of '{label}' for seed {seed}")
            r_star, eta = settings[(label, seed)]
            trials.append({"variant": variant(label, r_star, eta), "seed": seed})
    return trials


def trial_list_space(base: dict[str, Any], trials: list[dict], delta: float) -> dict[str, Any]:
    """The param space of an explicit trial list: one grid over the {"variant", "seed"}
    entries under the key "trial" (`trial_order` hands each trial its entry's "variant" and
    "seed"), each variant's config checked first."""
    check_variants(base, unique_variants([trial["variant"] for trial in trials]))
    return {"trial": {"grid_search": trials}, "base": base, "delta": delta}


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

    def space(self, base: dict[str, Any], delta: float) -> dict[str, Any]:
        """The constant part of every trial's config (the studies suggest the rest), after
        checking the corners of the search ranges for every label."""
        corners = grid_variants(self.labels, list(self.r_star_range), list(self.eta_range))
        check_variants(base, corners)
        return {"base": base, "delta": delta}


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


def waits_for_reference(config: ExperimentConfig) -> bool:
    """Whether a trial trains on same-seed ERM squash constants it does not have yet: ReLiF
    with the paper's squash (`relif.squash = "erm"`) on a data set with squashed scores."""
    relif = config.relif
    if not relif.enabled or relif.squash != "erm" or relif.squash_constants:
        return False
    return bool(benchmark(config.data.dataset).squashed_tasks)


def is_reference(config: ExperimentConfig) -> bool:
    """Whether a trial is an ERM reference: plain ERM on a data set with squashed scores."""
    plain_erm = config.method.name == "erm" and not config.relif.enabled
    return plain_erm and bool(benchmark(config.data.dataset).squashed_tasks)


@dataclass(frozen=True)
class TrialOrder:
    """The trials of a sweep in the order Tune gets them (`relif_ray.tuning.reference`).

    constants: the part of the Tune config every trial shares (base, delta, ...).
    items: {"config": {"variant", "seed"}, "needs": seed or None, "provides": seed or None}:
        ERM references first, then the trials that wait for nothing, then the waiting ones.
    studies_need_reference: whether Optuna's (ReLiF) trials wait for their seed's reference.
    added_references: seeds whose ERM reference trial the sweep added (none was asked for).
    """

    constants: dict[str, Any]
    items: list[dict[str, Any]]
    studies_need_reference: bool = False
    added_references: tuple[int, ...] = ()


def trial_order(
    space: dict[str, Any], search: OptunaPlan | None, ready_seeds: set[int]
) -> TrialOrder:
    """Order the grid of `param_space` (or the Optuna studies of `search` over the constant
    `space`) so every trial that needs its seed's ERM squash constants comes after that seed's
    ERM trial; seeds in `ready_seeds` already have their constants (`--reference`). A seed
    whose waiting trials have no ERM trial in the sweep gets one added."""
    base = space["base"]
    grids = {key: value["grid_search"] for key, value in space.items() if _is_grid(value)}
    constants = {key: value for key, value in space.items() if key not in grids}
    names = list(grids)
    trials = [dict(zip(names, values, strict=True)) for values in product(*grids.values())]
    trials = [{**trial, **trial.pop("trial")} if "trial" in trial else trial for trial in trials]
    if search is not None:
        trials = []
    trials.sort(key=lambda trial: trial["seed"])  # stable: the grid's order within a seed
    providers, plain, waiting = {}, [], []
    for trial in trials:
        item, seed = trial["variant"], trial["seed"]
        config = experiment_config({"base": base, "variant": item, "seed": seed})
        entry = {"config": trial, "needs": None, "provides": None}
        if waits_for_reference(config) and seed not in ready_seeds:
            waiting.append({**entry, "needs": seed})
        elif is_reference(config) and seed not in providers and seed not in ready_seeds:
            providers[seed] = {**entry, "provides": seed}
        else:
            plain.append(entry)
    studies_wait = False
    if search is not None:
        corner = variant(search.labels[0], search.r_star_range[0], search.eta_range[0])
        config = experiment_config({"base": base, "variant": corner, "seed": search.seeds[0]})
        studies_wait = waits_for_reference(config)
    needing = {entry["needs"] for entry in waiting}
    if studies_wait:
        needing |= {seed for seed in search.seeds if seed not in ready_seeds}
    added = tuple(sorted(seed for seed in needing if seed not in providers))
    for seed in added:
        entry = {"config": {"variant": variant("erm"), "seed": seed}, "needs": None}
        providers[seed] = {**entry, "provides": seed}
    items = [providers[seed] for seed in sorted(providers)] + plain + waiting
    return TrialOrder(constants, items, studies_wait, added)


def _is_grid(value: Any) -> bool:
    """Ray Tune's grid-search spec, {"grid_search": values} (see `param_space`)."""
    return isinstance(value, dict) and set(value) == {"grid_search"}
