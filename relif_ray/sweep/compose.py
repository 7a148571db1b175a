"""The sweep's base config from its layers: one pure function, no flags, no files.

Every trial of a sweep starts from one ExperimentConfig (`compose_config`), built from layers
of dotted fields that override each other, lowest first:

    the data set's defaults < its GPU fast path < --demo < --config < --set < the named flags

then the data set, its folder and the device are set. `--demo` contributes its data set's
demo settings and its budget (`demo_budget`, the one home of the demo-budget rule), which
also scales the controller to that budget. The command line (`relif_ray.cli.sweep`) reads the
layers from flags and files; this module only combines and checks them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relif_ray.config import ExperimentConfig
from relif_ray.errors import UserError
from relif_ray.problems import DatasetDefaults
from relif_ray.relif.controller import scale_to_budget
from relif_ray.sweep.trial_config import apply_overrides


@dataclass(frozen=True)
class DemoBudget:
    """What `--demo` sets of the training budget and the controller.

    fields: dotted config fields: the demo's own budget (train.epochs, train.max_steps) where
        the command line gives neither epochs nor steps, and relif.warmup_steps scaled to the
        step budget where there is one;
    eta: the controller grid's default eta, scaled to that step budget (None: the data set's).
    """

    fields: dict[str, Any] = field(default_factory=dict)
    eta: float | None = None


def demo_budget(defaults: DatasetDefaults, epochs: int | None, steps: int | None) -> DemoBudget:
    """The demo-budget rule: without --epochs and --steps the demo trains its own budget
    (`DatasetDefaults.demo_train`: steps or epochs); a step budget without an epoch budget
    (the demo's own, or --steps alone) gets the controller of
    `relif_ray.relif.controller.scale_to_budget`, so lambda moves as far as in the paper's
    200-epoch NYUv2 run (eta x steps and warmup / steps kept). A step budget that is not
    positive gets none (the config check then refuses it in one line, as without --demo)."""
    demo = defaults.demo_train
    fields: dict[str, Any] = {}
    if epochs is None and steps is None:
        fields = {"train.epochs": demo.get("epochs"), "train.max_steps": demo.get("steps")}
        steps = demo.get("steps")
    if steps is None or steps <= 0 or epochs is not None:
        return DemoBudget(fields)
    eta, warmup = scale_to_budget(steps, defaults.eta)
    return DemoBudget({**fields, "relif.warmup_steps": warmup}, eta)


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
) -> ExperimentConfig:
    """The validated base config: the data set's defaults, its GPU fast path where trials get
    a GPU (`DatasetDefaults.gpu_config`, unless `gpu_fast_path` is False), the --demo layer
    (with `demo`), then `layers` ((source, dotted fields), lowest first: --config, --set, the
    named flags), each checked as it is applied so that an error names the layer; then the
    data set at `data_root` with its `spec` (`data.spec`) and the device ("auto": CUDA where
    the trial's worker sees a GPU)."""
    config = apply_overrides(ExperimentConfig().to_dict(), dataset_fields(defaults))
    if use_gpu and gpu_fast_path:
        config = apply_overrides(config, defaults.gpu_config)
    if demo is not None:
        config = apply_overrides(config, demo_fields(defaults, demo))
    for source, fields in layers:
        config = apply_overrides(config, fields)
        if fields:
            check_config(config, source)
    config["data"] = {"dataset": defaults.dataset, "root": data_root, "spec": spec or {}}
    config["device"] = trial_device(use_gpu)
    return ExperimentConfig.from_dict(config)


def trial_device(use_gpu: bool) -> str:
    """The sweep's device rule: "auto" (CUDA where the trial's worker sees a GPU) where trials
    get a GPU, else "cpu" (`ExperimentConfig.device` defaults to "cpu", so a config built
    without this rule trains on the CPU even where Ray holds a GPU for it)."""
    return "auto" if use_gpu else "cpu"


def check_config(config: dict[str, Any], source: str) -> None:
    """The config after one layer of overrides must be valid; the error names the layer."""
    try:
        ExperimentConfig.from_dict(config)
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None
