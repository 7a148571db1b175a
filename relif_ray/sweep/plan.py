"""What a sweep will run, decided and checked before Ray starts (no Ray import).

The resources a sweep may use and each trial asks for (`Resources`), the grid of trial configs
(`param_space`, an explicit trial list at settings selected per seed (`selected_trials`), both a
`SweepSpace`), the Optuna studies (`OptunaPlan`), the paper's controller checks
(`controller_variants`), and the order Tune gets the trials in (`trial_order`: same-seed ERM
reference trials before the ReLiF trials that train on their squash constants).
`relif_ray.tuning` turns these into a Ray Tune run; a trial's Tune config is described in
`relif_ray.sweep.trial_config`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from relif_ray.config import ExperimentConfig, TrainConfig
from relif_ray.errors import UserError
from relif_ray.experiment.record import WORST
from relif_ray.reference import (
    config_reference_key,
    is_reference,
    reference_key,
    waits_for_reference,
)
from relif_ray.sweep.labels import grid_variants, unique_variants, uses_controller, variant
from relif_ray.sweep.preflight import check_trial_configs
from relif_ray.sweep.trial_config import TrialSpec, TuneKeys, tune_trial

# The defaults of the paper's controller checks (appendix "Controller sensitivity"): eta at
# one r*, r* from 0.16 to 0.28 in steps of 0.02 at one eta, and the static-lambda grid.
CONTROLLER_ETAS = "1e-4,1e-3,1e-2"
CONTROLLER_R_STARS = ",".join(f"{0.16 + 0.02 * i:g}" for i in range(7))
STATIC_LAMBDAS = "0.01,0.03,0.1,0.3,1.0"


GPUS_PER_TRIAL = 0.5
"""A GPU sweep's `--gpus-per-trial` when it is not given: two trials share each GPU. On an H200
at the paper's NYUv2 size two ERM trials per GPU trained 1.67x the images/s of one (GPU run 4,
docs/benchmarks.md): a trial's GPU waits through its setup and every epoch's validation,
audit and checkpoint, which a second trial fills. Three per GPU has not been measured. A
trial there peaked at 5,407 MiB of GPU memory, data on the device included."""


@dataclass(frozen=True)
class Resources:
    """What the sweep may use and what each trial asks for; its rules are checked when it is
    built, with one-line errors that name the sweep's flags (`--num-gpus`, ...).

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

    def __post_init__(self) -> None:
        for flag, value in (
            ("--cpus-per-trial", self.cpus_per_trial),
            ("--gpus-per-trial", self.gpus_per_trial),
            ("--num-gpus", self.num_gpus),
        ):
            if not math.isfinite(value) or value < 0:
                raise UserError(f"{flag}: must be a finite number >= 0, got {value:g}")
        if self.cpus_per_trial == 0:
            raise UserError("--cpus-per-trial: must be > 0, got 0")
        if self.num_cpus is not None and self.num_cpus <= 0:
            raise UserError(f"--num-cpus: must be > 0, got {self.num_cpus}")
        self._check_gpus()

    def _check_gpus(self) -> None:
        per_trial, total = self.gpus_per_trial, self.num_gpus
        if per_trial > 1 and not float(per_trial).is_integer():
            raise UserError(
                f"--gpus-per-trial {per_trial:g}: above 1 it must be a whole number of GPUs"
            )
        if per_trial > 0 and total == 0:
            raise UserError(
                f"--gpus-per-trial {per_trial:g}: trials ask for GPUs but --num-gpus is 0"
            )
        if total > 0 and per_trial == 0:
            raise UserError(
                f"--num-gpus {total:g} with --gpus-per-trial 0: no trial would use a GPU "
                "(drop --num-gpus for a CPU sweep)"
            )
        if per_trial > total:
            raise UserError(
                f"--gpus-per-trial {per_trial:g} exceeds --num-gpus {total:g}: "
                "no trial could ever start"
            )

    @property
    def max_concurrent_trials(self) -> int | None:
        if self.gpus_per_trial <= 0:
            return None
        return max(1, math.floor(self.num_gpus / self.gpus_per_trial + 1e-9))


@dataclass
class SweepSpace:
    """What Tune runs: the `base` config every trial shares, the live audit's `delta`, and
    `trials` (label, seed, the variant's overrides) in the order the searcher hands them out
    (empty for Optuna, whose studies suggest them); `trial.config(base)` is the config that
    runs. `relif_ray.sweep.trial_config` converts them for Tune.

    shared: Tune-only keys every trial's Tune config carries besides the config
        (`relif_ray.sweep.trial_config.TuneKeys`): a subclassed Trainable's own settings (the
        benchmarks' `timing_dir`) and the test-only `fault_injection_step`.
    """

    base: ExperimentConfig
    delta: float
    trials: list[TrialSpec] = field(default_factory=list)
    shared: TuneKeys = TuneKeys()


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
    scheduler_metric: str = WORST
    asha_grace_epochs: int = 1
    asha_reduction_factor: float = 3.0
    asha_max_epochs: int | None = None
    max_concurrent_trials: int | None = None
    callbacks: tuple[str, ...] = ()


def trial_space(base: ExperimentConfig, trials: list[TrialSpec], delta: float) -> SweepSpace:
    """The sweep of an explicit list of trials. Every distinct setting's config is built once
    before Ray starts, then its method and model (`relif_ray.sweep.preflight`), so no trial
    fails on a bad value or option."""
    settings = {repr((trial.label, sorted(trial.overrides.items()))): trial for trial in trials}
    check_trial_configs([trial.config(base) for trial in settings.values()])
    return SweepSpace(base, float(delta), list(trials))


def param_space(
    base: ExperimentConfig, variants: list[dict], seeds: list[int], delta: float
) -> SweepSpace:
    """The grid: every variant crossed with every seed (variant-major), each setting checked
    first (`trial_space`); with `train.fused_seeds` S > 1, each variant's seeds in trials of
    S (`fused_chunks`)."""
    trials = [
        TrialSpec.of(item, chunk[0], fused_seeds=chunk if len(chunk) > 1 else ())
        for item in variants
        for chunk in fused_chunks(seeds, base.train.fused_seeds)
    ]
    return trial_space(base, trials, delta)


def fused_chunks(seeds: list[int], size: int) -> list[tuple[int, ...]]:
    """`seeds` in consecutive trials of `size` seeds (the last may hold fewer)."""
    return [tuple(seeds[start : start + size]) for start in range(0, len(seeds), size)]


def selected_trials(
    labels: list[str],
    seeds: list[int],
    settings: dict[tuple[str, int], tuple[float, float]],
    source: str,
) -> list[TrialSpec]:
    """The sweep's trials as an explicit list (for `trial_space`): each label with each seed, a
    label whose controller uses (r*, eta) at the (r*, eta) selected for that seed (`settings`:
    (label, seed) -> (r*, eta), chosen from the Optuna search `source`), every other label as
    it is."""
    studied = {label for label, _ in settings}
    trials = []
    for label in labels:
        for seed in seeds:
            if not uses_controller(label):
                trials.append(TrialSpec.of(variant(label), seed))
                continue
            if label not in studied:
                raise UserError(
                    f"--select-from {source}: no study of '{label}' "
                    f"(studied: {', '.join(sorted(studied)) or 'none'})"
                )
            if (label, seed) not in settings:
                raise UserError(f"--select-from {source}: no study of '{label}' for seed {seed}")
            r_star, eta = settings[(label, seed)]
            trials.append(TrialSpec.of(variant(label, r_star, eta), seed))
    return trials


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

    def space(self, base: ExperimentConfig, delta: float) -> SweepSpace:
        """The sweep without trials (the studies suggest them), after checking the corners of
        the search ranges for every label."""
        corners = grid_variants(self.labels, list(self.r_star_range), list(self.eta_range))
        trial_space(base, [TrialSpec.of(item, self.seeds[0]) for item in corners], delta)
        return SweepSpace(base, float(delta))

    def corner(self) -> TrialSpec:
        """The first study's trial at the lower corner of the ranges (what every study's
        trials share: their label's method and the base config)."""
        item = variant(self.labels[0], self.r_star_range[0], self.eta_range[0])
        return TrialSpec.of(item, self.seeds[0])


def controller_variants(
    eta_r_star: float,
    etas: list[float],
    r_stars: list[float],
    r_star_eta: float,
    static_lambdas: list[float],
    label: str = "relif",
) -> list[dict]:
    """The paper's controller checks (appendix "Controller sensitivity", section 5):
    eta in `etas` at r* = `eta_r_star`; r* in `r_stars` at eta = `r_star_eta`, both of the
    adaptive ReLiF `label` (default "relif", the paper's); lambda fixed at each of
    `static_lambdas` ("relif-static"); plus ERM, the same-seed reference the audit squashes
    NYUv2 scores with. A setting in two checks is trained once."""
    variants = [variant("erm")]
    variants += [variant(label, eta_r_star, eta) for eta in etas]
    variants += [variant(label, r_star, r_star_eta) for r_star in r_stars]
    variants += [
        variant("relif-static", extra={"relif.lambda0": value}) for value in static_lambdas
    ]
    return unique_variants(variants)


@dataclass(frozen=True)
class TrialOrder:
    """The trials of a sweep in the order Tune gets them (`relif_ray.tuning.order`).

    items: {"config": the trial (a `TrialSpec` of `SweepSpace.trials`), "needs": the
        reference key (`relif_ray.reference.reference_key`: the seed, with the architecture
        where it is not hard sharing) of the ERM trial it waits for or None, "provides": the
        key of the ERM reference it is or None}: ERM references first, then the trials that
        wait for nothing, then the waiting ones.
    studies_need_reference: whether Optuna's (ReLiF) trials wait for their seed's reference.
    study_keys: seed -> reference key of the Optuna studies' trials.
    added_references: keys whose ERM reference trial the sweep added (none was asked for).
    """

    items: list[dict[str, Any]]
    studies_need_reference: bool = False
    study_keys: dict[int, str] = field(default_factory=dict)
    added_references: tuple[str, ...] = ()

    def tune_items(self) -> list[dict[str, Any]]:
        """The items as Tune's searcher hands them out: each trial as its Tune config's own part
        (`relif_ray.sweep.trial_config.tune_trial`)."""
        return [{**item, "config": tune_trial(item["config"])} for item in self.items]


def trial_order(space: SweepSpace, search: OptunaPlan | None, ready: set[str]) -> TrialOrder:
    """Order the trials of `space` (or the Optuna studies of `search` over its base) so
    every trial that needs its seed's ERM squash constants comes after that seed's ERM trial
    of its architecture; reference keys in `ready` already have their constants
    (`--reference`). A key whose waiting trials have no ERM trial in the sweep gets one added."""
    trials = [] if search is not None else list(space.trials)
    trials.sort(key=lambda trial: trial.seed)  # stable: the sweep's order within a seed
    providers, provided, plain, waiting, needed = {}, set(), [], [], {}
    for trial in trials:
        configs = trial.seed_configs(space.base)
        keys = [config_reference_key(config) for config in configs]
        config = configs[0]
        entry = {"config": trial, "needs": None, "provides": None}
        if waits_for_reference(config) and any(key not in ready for key in keys):
            waiting.append({**entry, "needs": reference_keys(keys)})
            needed.update(
                {key: (c.seed, c.model.architecture) for key, c in zip(keys, configs, strict=True)}
            )
        elif is_reference(config) and not provided & set(keys) and keys[0] not in ready:
            providers[keys[0]] = {**entry, "provides": reference_keys(keys)}
            provided.update(keys)
            for key, seed_config in zip(keys, configs, strict=True):
                needed.setdefault(key, (seed_config.seed, seed_config.model.architecture))
        else:
            plain.append(entry)
    studies_wait, study_keys = False, {}
    if search is not None:
        config = search.corner().config(space.base)
        studies_wait = waits_for_reference(config)
        architecture = config.model.architecture
        study_keys = {seed: reference_key(seed, architecture) for seed in search.seeds}
        if studies_wait:
            needed.update({study_keys[s]: (s, architecture) for s in search.seeds})
    missing = [key for key in needed if key not in provided and key not in ready]
    added = tuple(sorted(missing, key=lambda key: needed[key][0]))
    for keys, trial in added_references(space, [(key, *needed[key]) for key in added]):
        providers[keys[0]] = {"config": trial, "needs": None, "provides": reference_keys(keys)}
    by_seed = sorted(providers, key=lambda key: needed[key][0])  # stable: sweep order
    items = [providers[key] for key in by_seed] + plain + waiting
    return TrialOrder(items, studies_wait, study_keys, added)


def reference_keys(keys: list[str]) -> str | list[str]:
    """An item's "needs" or "provides": a trial of one seed's key, a fused trial's list."""
    return keys[0] if len(keys) == 1 else list(keys)


def added_references(
    space: SweepSpace, missing: list[tuple[str, int, str]]
) -> list[tuple[list[str], TrialSpec]]:
    """The ERM reference trials a sweep adds for the (key, seed, architecture) it lacks: one
    per seed, or with `train.fused_seeds` one per architecture's chunk of seeds."""
    size = space.base.train.fused_seeds
    by_architecture: dict[str, list[tuple[str, int]]] = {}
    for key, seed, architecture in missing:
        by_architecture.setdefault(architecture, []).append((key, seed))
    added = []
    for architecture, entries in by_architecture.items():
        for start in range(0, len(entries), size):
            chunk = entries[start : start + size]
            trial = reference_trial(space, chunk[0][1], architecture)
            if len(chunk) > 1:
                trial = replace(trial, fused_seeds=tuple(seed for _, seed in chunk))
            added.append(([key for key, _ in chunk], trial))
    return added


def reference_trial(space: SweepSpace, seed: int, architecture: str) -> TrialSpec:
    """The ERM reference trial of `seed` and `architecture`."""
    own = architecture != space.base.model.architecture
    return TrialSpec.of(
        variant("erm", extra={"model.architecture": architecture} if own else {}), seed
    )


def plan_summary(space: SweepSpace, search: OptunaPlan | None, resources: Resources) -> str:
    """One line saying what a new sweep will run, printed before Ray starts: how many trials
    (settings x seeds, or Optuna studies x samples), their labels and seeds, and how many run
    at once on what. ERM reference trials the sweep adds are announced when Tune starts."""
    if search is not None:
        labels, seeds = search.labels, search.seeds
        studies = len(labels) * len(seeds)
        count = f"{search.total_trials} trials ({studies} Optuna studies x {search.num_samples})"
    else:
        labels = list(dict.fromkeys(trial.label for trial in space.trials))
        seeds = sorted({trial.seed for trial in space.trials})
        settings = len(space.trials) // max(len(seeds), 1)
        count = f"{len(space.trials)} trials ({settings} settings x {len(seeds)} seeds)"
    path = f"; {gpu_path_text(space.base.train)}" if resources.gpus_per_trial > 0 else ""
    return (
        f"plan: {count}; labels {', '.join(labels)}; seeds {seed_text(seeds)}; "
        f"{resources_text(resources)}{path}"
    )


def gpu_path_text(train: TrainConfig) -> str:
    """Which path GPU trials run, from the sweep's base config: the fast path's fields
    (`DatasetDefaults.gpu_config`, `--no-gpu-fast-path`) and `train.cuda_graph`."""
    fast = [
        "bf16 forward" if train.precision == "bf16" else "fp32",
        "channels-last" if train.channels_last else "NCHW",
        "data on the GPU" if train.data_on_device else "batches from the host",
    ]
    graph = train.cuda_graph == "auto" and train.data_on_device
    steps = "the step as one CUDA graph where the method allows" if graph else "eager steps"
    return f"GPU trials run {', '.join(fast)}, {steps}"


def seed_text(seeds: list[int]) -> str:
    """`0-6` for a run of consecutive seeds, else the list."""
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(str(seed) for seed in seeds)


def resources_text(resources: Resources) -> str:
    where = f"the Ray cluster at {resources.address}" if resources.address else "local Ray"
    per_trial = f"{resources.cpus_per_trial:g} CPU"
    if resources.gpus_per_trial > 0:
        per_trial += f" + {resources.gpus_per_trial:g} GPU"
        return (
            f"at most {resources.max_concurrent_trials} at once on {resources.num_gpus:g} "
            f"GPU(s) of {where} ({per_trial} per trial)"
        )
    return f"on the CPUs of {where} ({per_trial} per trial)"
