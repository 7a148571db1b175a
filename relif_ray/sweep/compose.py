"""The sweep's base config from its layers: one pure function, no flags, no files.

Every trial of a sweep starts from one ExperimentConfig (`compose_config`), built from layers
of dotted fields that override each other, lowest first:

    the data set's defaults < its GPU fast path < --demo < --config < --set < the named flags

then the data set, its folder and the device are set. `--demo` contributes its data set's
demo settings and its budget (`demo_budget`, the one home of the demo-budget rule). The
controller's default eta and warmup follow the trial's step budget (`controller_budget`, the
one home of the controller-budget rule), a layer between --demo and --config. The command line
(`relif_ray.cli.sweep`) reads the layers from flags and files; this module only combines and
checks them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relif_ray.config import ExperimentConfig, ReLiFConfig, TrainConfig
from relif_ray.errors import UserError
from relif_ray.problems import DatasetDefaults
from relif_ray.relif.controller import PAPER_NYUV2_STEPS, scale_to_budget
from relif_ray.schedule import step_budget
from relif_ray.sweep.trial_config import apply_overrides, with_fields


@dataclass(frozen=True)
class DemoBudget:
    """What `--demo` sets of the training budget.

    fields: dotted config fields: the demo's own budget (train.epochs, train.max_steps) where
        the command line gives neither epochs nor steps.
    """

    fields: dict[str, Any] = field(default_factory=dict)


def demo_budget(defaults: DatasetDefaults, epochs: int | None, steps: int | None) -> DemoBudget:
    """The demo-budget rule: without --epochs and --steps the demo trains its own budget
    (`DatasetDefaults.demo_train`: steps or epochs). The controller then follows that budget
    as every sweep's does (`controller_budget`)."""
    demo = defaults.demo_train
    if epochs is None and steps is None:
        fields = {"train.epochs": demo.get("epochs"), "train.max_steps": demo.get("steps")}
        return DemoBudget(fields)
    return DemoBudget()


@dataclass(frozen=True)
class ControllerBudget:
    """The controller's default eta and warmup for a sweep's trials (`controller_budget`).

    eta, warmup_steps: the values; steps: the trials' step budget (None: not known before the
    data exists); rule: how they were chosen, "paper" (the paper's eta for this data set and
    budget), "scaled" (`relif_ray.relif.controller.scale_to_budget` of `steps`) or "unknown
    budget" (the data set's eta, the step budget being unknown).
    """

    eta: float
    warmup_steps: int
    steps: int | None
    rule: str

    def fields(self) -> dict[str, Any]:
        """The layer the rule contributes to the base config (between --demo and --config):
        relif.eta, the controller grid's default (`relif_ray.cli.sweep.controller_grid`), and
        relif.warmup_steps."""
        return {"relif.eta": self.eta, "relif.warmup_steps": self.warmup_steps}

    def line(self) -> str:
        """One line for the sweep's output: the values and why."""
        values = f"ReLiF controller: eta {self.eta:.4g}, warmup {self.warmup_steps}"
        if self.rule == "paper":
            return f"{values} (the paper's for this data set and budget)"
        if self.rule == "unknown budget":
            return f"{values} (the data set's: the step budget is unknown before the data exists)"
        return (
            f"{values} for {self.steps:,} steps (eta x steps {self.eta * self.steps:.3g} and "
            f"warmup / steps as in the paper's {PAPER_NYUV2_STEPS:,}-step NYUv2 run); "
            "--eta and --warmup-steps override"
        )


def controller_budget(
    defaults: DatasetDefaults, train: TrainConfig, train_examples: Callable[[], int | None]
) -> ControllerBudget:
    """The controller-budget rule: the paper's multiplicative update (Eq. 12) moves log lambda
    by about eta x steps x mean(r~ - r*) over a run, so one eta cannot serve every run length:
    the paper's eta 1e-3 over its 19,800-step NYUv2 run gives eta x steps 19.8, over a
    1,100-step run 1.1, and lambda hardly leaves lambda0.

    Where the paper fixes eta for this data set at the budget at hand
    (`DatasetDefaults.paper_eta`: the data set's own epochs and batch size, no step cap), its
    eta and the paper's warmup stay. Everywhere else eta and warmup keep eta x steps and
    warmup / steps of the paper's NYUv2 run (`scale_to_budget` of the trial's step budget:
    `relif_ray.schedule.step_budget` of the epochs, the step cap and the full batches of
    `train_examples()`, asked only where an epoch budget needs it). Where it is None (no data
    yet) an epoch budget is unknown: the data set's eta and the paper's warmup stay, and the
    rule says so."""
    warmup = ReLiFConfig().warmup_steps  # the paper's (Table 5)
    paper_budget = (
        train.epochs == defaults.epochs
        and train.max_steps is None
        and train.batch_size == defaults.batch_size
    )
    if defaults.paper_eta and paper_budget:
        return ControllerBudget(defaults.eta, warmup, None, "paper")
    steps = train.max_steps if train.epochs is None else None
    if train.epochs is not None and (examples := train_examples()) is not None:
        per_epoch = max(examples // train.batch_size, 1)  # full batches, as the engine's
        steps = step_budget(train.epochs, train.max_steps, per_epoch)
    if steps is None or steps <= 0:
        return ControllerBudget(defaults.eta, warmup, None, "unknown budget")
    eta, warmup = scale_to_budget(steps, defaults.eta, warmup)
    return ControllerBudget(eta, warmup, steps, "scaled")


def dataset_fields(defaults: DatasetDefaults) -> dict[str, Any]:
    """The data set's budget and settings as dotted config fields."""
    return {
        **defaults.config,
        "model.backbone": defaults.backbone,
        "train.epochs": defaults.epochs,
        "train.batch_size": defaults.batch_size,
        "train.lr": defaults.lr,
    }


def demo_fields(defaults: DatasetDefaults, budget: DemoBudget) -> dict[str, Any]:
    """The --demo layer: the data set's demo settings and the demo budget."""
    demo = defaults.demo_train
    fields = {
        **defaults.demo_config,
        "train.batch_size": demo["batch_size"],
        "train.lr": demo["lr"],
    }
    if "backbone" in demo:
        fields["model.backbone"] = demo["backbone"]
    return {**fields, **budget.fields}


def compose_config(
    defaults: DatasetDefaults,
    layers: list[tuple[str, dict[str, Any]]],
    data_root: str,
    use_gpu: bool,
    demo: DemoBudget | None = None,
    gpu_fast_path: bool = True,
    spec: dict[str, Any] | None = None,
    controller: ControllerBudget | None = None,
) -> ExperimentConfig:
    """The validated base config: the data set's defaults, its GPU fast path where trials get
    a GPU (`DatasetDefaults.gpu_config`, unless `gpu_fast_path` is False), the --demo layer
    (with `demo`), the controller-budget layer (with `controller`), then `layers` ((source,
    dotted fields), lowest first: --config, --set, the named flags), each applied to the typed
    config and checked as it is, so that an error names the layer
    (`relif_ray.sweep.trial_config.with_fields`); then the data set at `data_root` with its
    `spec` (`data.spec`) and the device ("auto": CUDA where the trial's worker sees a GPU)."""
    values = apply_overrides(ExperimentConfig().to_dict(), dataset_fields(defaults))
    if use_gpu and gpu_fast_path:
        values = apply_overrides(values, defaults.gpu_config)
    if demo is not None:
        values = apply_overrides(values, demo_fields(defaults, demo))
    if controller is not None:
        values = apply_overrides(values, controller.fields())
    config = ExperimentConfig.from_dict(values)
    for source, layer in layers:
        try:
            config = with_fields(config, layer)
        except UserError as exc:
            raise UserError(f"{source}: {exc}") from None
    data = {"dataset": defaults.dataset, "root": data_root, "spec": spec or {}}
    return with_fields(config, {"data": data, "device": trial_device(use_gpu)})


def trial_device(use_gpu: bool) -> str:
    """The sweep's device rule: "auto" (CUDA where the trial's worker sees a GPU) where trials
    get a GPU, else "cpu" (`ExperimentConfig.device` defaults to "cpu", so a config built
    without this rule trains on the CPU even where Ray holds a GPU for it)."""
    return "auto" if use_gpu else "cpu"
