"""Command-line sweeps: parse and check flags, then launch the planned trials on Ray Tune.

`sweeps/nyuv2.py`, `sweeps/clinical.py` and `sweeps/controller_sensitivity.py` are thin
wrappers around `main`. Everything is validated before Ray starts, every trial config included;
user mistakes exit with status 2 and one line `<script>: error: <what is wrong>`.

A data set plugs in as a benchmark module of `relif_ray.problems` (budget, model, live delta,
demo data writer); the flags, grid (`relif_ray.planning`), resources and launch
(`relif_ray.tuning`) are shared.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from relif_ray import storage
from relif_ray.config import ExperimentConfig
from relif_ray.errors import UserError
from relif_ray.experiment_lock import exclusive_experiment, prepare_new_experiment
from relif_ray.methods import METHODS
from relif_ray.overrides import parse_set, read_config_file
from relif_ray.pareto import SELECTION_FILE, read_pareto, select_settings
from relif_ray.planning import (
    CONTROLLER_ETAS,
    CONTROLLER_R_STARS,
    LOGGER_CALLBACKS,
    SCHEDULER_METRICS,
    STATIC_LAMBDAS,
    OptunaPlan,
    Resources,
    SweepSpace,
    TuneOptions,
    controller_variants,
    param_space,
    selected_trials,
    trial_space,
)
from relif_ray.preflight import check_data, check_storage, lent_constants
from relif_ray.problems import DatasetDefaults, benchmark, benchmarks
from relif_ray.relif.controller import scale_to_budget
from relif_ray.sweep_outcome import (
    EXIT_TRIALS_ERRORED,
    TrialsErrored,
    retry_command,
    summary_lines,
)
from relif_ray.variants import (
    RELIF_LABELS,
    apply_overrides,
    grid_variants,
    split_label,
    uses_controller,
)

DATASETS: dict[str, DatasetDefaults] = {name: b.defaults for name, b in benchmarks().items()}
"""Every registered benchmark's defaults (`relif_ray.problems`): `--dataset` of sweeps/run.py
and sweeps/controller_sensitivity.py."""
NYUV2, MIMIC3 = DATASETS["nyuv2"], DATASETS["mimic3"]
CLINICAL = {name: DATASETS[name] for name in ("mimic3", "eicu")}
CHECKPOINT_INTERVAL_S = 10.0
"""--checkpoint-interval's default: at most one checkpoint per trial in 10 s, as Tune snapshots
the experiment state at most every 10 s on its own (`relif_ray.tuning.launch.CheckpointCadence`)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is a `UserError` (one line, exit 2) instead of usage + exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(message)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows `(default: X)` only where there is a default to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def default_methods() -> str:
    """Every registered MTL method, then ReLiF (= ERM + ReLiF)."""
    names = sorted(METHODS, key=lambda name: (name != "erm", name))
    return ",".join([*names, "relif"])


def build_parser(
    defaults: DatasetDefaults,
    dataset_choices: tuple[str, ...] = (),
    *,
    description: str | None = None,
    grid_flags: bool = True,
) -> OneLineParser:
    """The flags shared by every sweep; `dataset_choices` adds --dataset, `grid_flags` adds
    --methods/--r-star/--eta/--search."""
    description = description or (
        f"Ray Tune sweep of MTL methods x seeds (x ReLiF settings) on {defaults.dataset}."
    )
    parser = OneLineParser(description=description, formatter_class=DefaultsHelpFormatter)
    data = parser.add_argument_group("data and budget")
    if dataset_choices:
        data.add_argument(
            "--dataset", choices=dataset_choices, default=defaults.dataset, help="data set"
        )
    data.add_argument("--data-dir", help="data set root (the real data or `relif make-data`)")
    data.add_argument(
        "--demo", action="store_true", help="small synthetic data and budget; minutes on a CPU"
    )
    demo = defaults.demo_train
    data.add_argument(
        "--seeds",
        help=f"a count (seeds 0..N-1) or a list like 0,3,5 (default: {defaults.seeds}; "
        f"demo: {demo['seeds']})",
    )
    data.add_argument(
        "--epochs",
        type=int,
        help=f"epochs per trial (default: {defaults.epochs}; demo: "
        f"{demo.get('epochs', 'none')}; none with --steps alone)",
    )
    data.add_argument(
        "--steps",
        type=int,
        help="optimisation steps per trial: alone, exactly N steps (across epochs); with "
        f"--epochs, the smaller of the two budgets wins (demo: {demo.get('steps', 'none')})",
    )
    data.add_argument(
        "--batch-size", type=int, help=f"training batch size (default: {defaults.batch_size})"
    )
    data.add_argument("--lr", type=float, help=f"learning rate (default: {defaults.lr:g})")
    data.add_argument(
        "--backbone",
        help=f"model backbone (default: {defaults.backbone}; demo: "
        f"{demo.get('backbone', defaults.backbone)})",
    )
    data.add_argument(
        "--warmup-steps",
        type=int,
        help="ReLiF controller warmup steps (default: 100; demo: scale_to_budget, warmup / "
        "steps as in the paper's NYUv2 run)",
    )
    data.add_argument(
        "--delta",
        type=float,
        default=defaults.delta,
        help="threshold of the live validation Bias (progress table, Optuna objective)",
    )
    if grid_flags:
        grid = parser.add_argument_group("grid")
        grid.add_argument(
            "--methods",
            help="comma-separated labels: registered methods, "
            f"{', '.join(RELIF_LABELS)}, or <method>+relif (default: {default_methods()}; "
            f"demo: {defaults.demo_train['methods']}; with --search optuna: relif)",
        )
        grid.add_argument(
            "--r-star", help=f"ReLiF controller targets (list) (default: {defaults.r_star:g})"
        )
        grid.add_argument(
            "--eta",
            help=f"ReLiF controller step sizes (list) (default: {defaults.eta:g}; demo: "
            "scaled to the demo's step budget with scale_to_budget, eta x steps as in the "
            "paper's 200-epoch NYUv2 run)",
        )
        grid.add_argument(
            "--search",
            choices=["grid", "optuna"],
            default="grid",
            help="grid: methods x seeds x (r*, eta); optuna: per ReLiF label and seed, a "
            "multi-objective study over (r*, eta) (min val Bias, max val Worst)",
        )
        grid.add_argument(
            "--num-samples", type=int, default=16, help="--search optuna: trials per study"
        )
        grid.add_argument(
            "--r-star-range", default="0.1,0.4", help="--search optuna: r* bounds LOW,HIGH"
        )
        grid.add_argument(
            "--eta-range", default="1e-4,1e-2", help="--search optuna: eta bounds (log scale)"
        )
        grid.add_argument(
            "--select-from",
            metavar="SEARCH_EXPERIMENT",
            help="run each controller-driven ReLiF label and seed at the (r*, eta) selected "
            "from the pareto.csv of this --search optuna experiment (path or URI): the lowest "
            "validation Bias within --select-worst-tolerance of the study's best validation "
            "Worst",
        )
        grid.add_argument(
            "--select-worst-tolerance",
            type=float,
            default=0.02,
            help="--select-from: how far below the study's best validation Worst a chosen "
            "point may be",
        )
    add_config_flags(parser)
    add_launch_flags(parser, defaults)
    add_tune_flags(parser)
    return parser


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Any config field, and short flags for the common ones. Precedence, lowest first: the
    data set's defaults, --demo, --config, --set, the named flags."""
    config = parser.add_argument_group(
        "config fields (precedence: data-set defaults < --demo < --config < --set < named flags)"
    )
    config.add_argument(
        "--config", metavar="FILE.yaml", help="config fields from YAML (nested or dotted keys)"
    )
    config.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="set one config field, e.g. train.precision=bf16 (repeatable; YAML values)",
    )
    config.add_argument(
        "--precision", choices=["fp32", "bf16"], help="train.precision (bf16: autocast forward)"
    )
    config.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        help="train.channels_last (NHWC weights and images)",
    )
    config.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, help="train.compile (torch.compile)"
    )
    config.add_argument(
        "--pretrained",
        metavar="imagenet|PATH|none",
        help="model.pretrained: torchvision's ImageNet weights, a local state_dict file, or "
        "random (default: none)",
    )


def add_tune_flags(parser: argparse.ArgumentParser) -> None:
    tune = parser.add_argument_group("Tune scheduling and logging")
    tune.add_argument(
        "--scheduler",
        choices=["fifo", "asha"],
        default="fifo",
        help="fifo: every trial runs its budget; asha: successive halving per epoch on "
        "--scheduler-metric (ERM reference trials are never stopped)",
    )
    tune.add_argument(
        "--scheduler-metric",
        choices=list(SCHEDULER_METRICS),
        default="worst",
        help="what ASHA ranks by: worst, macro (validation, max) or val_bias (min)",
    )
    tune.add_argument("--max-concurrent-trials", type=int, help="at most this many trials at once")
    tune.add_argument(
        "--callbacks",
        default="",
        help="Ray's logger integrations: wandb, mlflow or wandb,mlflow (TensorBoard and "
        "CSV/JSON are always written)",
    )


def add_launch_flags(parser: argparse.ArgumentParser, defaults: DatasetDefaults) -> None:
    launch = parser.add_argument_group("resources, storage, recovery")
    launch.add_argument(
        "--num-gpus", type=float, default=0, help="GPUs the sweep may use in total (0 = CPU)"
    )
    launch.add_argument(
        "--gpus-per-trial",
        type=float,
        help="GPUs per trial; fractions pack trials (0.5 = two per GPU) "
        "(default: 1 if --num-gpus > 0, else 0)",
    )
    launch.add_argument("--cpus-per-trial", type=float, default=1, help="CPUs per trial")
    launch.add_argument("--num-cpus", type=int, help="CPUs of local Ray (default: all)")
    launch.add_argument(
        "--address",
        help="an existing Ray cluster: auto (the one this node belongs to) or HEAD_IP:6379 "
        "(default: start local Ray)",
    )
    launch.add_argument(
        "--storage", default="relif-results", help="experiment storage: local, NFS or s3:// URI"
    )
    launch.add_argument(
        "--name", help=f"experiment name (default: {defaults.dataset}, {defaults.dataset}-demo)"
    )
    launch.add_argument("--max-failures", type=int, default=2, help="restarts of a failed trial")
    launch.add_argument(
        "--keep-checkpoints", type=int, default=2, help="checkpoints kept per trial"
    )
    launch.add_argument(
        "--checkpoint-interval",
        type=float,
        default=CHECKPOINT_INTERVAL_S,
        metavar="SECONDS",
        help="a trial checkpoints at the end of an epoch, but at most once in this many seconds "
        "(0: every epoch); the last epoch always",
    )
    launch.add_argument(
        "--resume",
        action="store_true",
        help="continue the killed sweep --name in --storage (other grid flags are ignored)",
    )
    launch.add_argument(
        "--reference",
        metavar="EXPERIMENT",
        help="take the same-seed ERM squash constants that ReLiF trains on from this finished "
        "experiment (directory or URI) instead of running ERM reference trials first",
    )


def parse_seeds(text: str) -> list[int]:
    """`7` -> seeds 0..6; `0,3,5` -> exactly those."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(
            f"--seeds: expected a count or a comma-separated list, got '{text}'"
        ) from None
    if "," not in text:
        if not values or values[0] <= 0:
            raise UserError(f"--seeds: a count must be positive, got '{text}'")
        return list(range(values[0]))
    if not values or min(values) < 0 or len(set(values)) != len(values):
        raise UserError(f"--seeds: a list needs distinct non-negative seeds, got '{text}'")
    return values


def parse_floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"{flag}: expected comma-separated numbers, got '{text}'") from None
    if not values or not all(math.isfinite(value) for value in values):
        raise UserError(f"{flag}: expected comma-separated finite numbers, got '{text}'")
    return values


def parse_range(text: str, flag: str, positive: bool = False) -> tuple[float, float]:
    values = parse_floats(text, flag)
    if len(values) != 2 or not values[0] < values[1] or (positive and values[0] <= 0):
        need = "0 < LOW < HIGH" if positive else "LOW < HIGH"
        raise UserError(f"{flag}: expected LOW,HIGH with {need}, got '{text}'")
    return values[0], values[1]


def parse_labels(text: str) -> list[str]:
    """Method labels, each checked against the method registry and the ReLiF labels."""
    labels = [label.strip() for label in text.split(",") if label.strip()]
    if not labels:
        raise UserError("--methods: no method given")
    for label in labels:
        method, _ = split_label(label)
        if method not in METHODS:
            raise UserError(
                f"--methods: unknown method '{method}' (known: {', '.join(sorted(METHODS))}, "
                f"{', '.join(RELIF_LABELS)})"
            )
    if len(set(labels)) != len(labels):
        raise UserError(f"--methods: a label is repeated in '{text}'")
    return labels


def resources(args: argparse.Namespace) -> Resources:
    """The validated `Resources` of the flags (checked again against the cluster once Ray is
    up)."""
    gpus_per_trial = args.gpus_per_trial
    if gpus_per_trial is None:
        gpus_per_trial = 1.0 if args.num_gpus > 0 else 0.0
    if args.num_gpus < 0 or gpus_per_trial < 0:
        raise UserError("--num-gpus and --gpus-per-trial must be >= 0")
    if not args.cpus_per_trial > 0:
        raise UserError(f"--cpus-per-trial: must be > 0, got {args.cpus_per_trial:g}")
    if gpus_per_trial > 1 and not float(gpus_per_trial).is_integer():
        raise UserError(
            f"--gpus-per-trial {gpus_per_trial:g}: above 1 it must be a whole number of GPUs"
        )
    if gpus_per_trial > 0 and args.num_gpus == 0:
        raise UserError(
            f"--gpus-per-trial {gpus_per_trial:g}: trials ask for GPUs but --num-gpus is 0"
        )
    if args.num_gpus > 0 and gpus_per_trial == 0:
        raise UserError(
            f"--num-gpus {args.num_gpus:g} with --gpus-per-trial 0: no trial "
            "would use a GPU (drop --num-gpus for a CPU sweep)"
        )
    if gpus_per_trial > args.num_gpus:
        raise UserError(
            f"--gpus-per-trial {gpus_per_trial:g} exceeds --num-gpus {args.num_gpus:g}: "
            "no trial could ever start"
        )
    if args.num_cpus is not None and args.num_cpus <= 0:
        raise UserError(f"--num-cpus: must be > 0, got {args.num_cpus}")
    if args.max_failures < 0 or args.keep_checkpoints < 1:
        raise UserError("--max-failures must be >= 0 and --keep-checkpoints >= 1")
    if not 0 <= args.checkpoint_interval < math.inf:
        raise UserError(
            f"--checkpoint-interval: must be >= 0 seconds, got {args.checkpoint_interval:g}"
        )
    return Resources(
        cpus_per_trial=args.cpus_per_trial,
        gpus_per_trial=gpus_per_trial,
        num_gpus=args.num_gpus,
        num_cpus=args.num_cpus,
        address=args.address,
    )


def data_root(args: argparse.Namespace, defaults: DatasetDefaults) -> str:
    """The data set folder: --data-dir, or for --demo a folder next to the results."""
    if args.data_dir:
        if not Path(args.data_dir).is_dir():
            raise UserError(f"--data-dir: no such directory: {args.data_dir}")
        return str(Path(args.data_dir).resolve())
    if not args.demo:
        raise UserError("--data-dir is required (or use --demo for synthetic data)")
    if "://" in args.storage:
        raise UserError("--demo writes its data next to the results: use a local --storage")
    return str(Path(args.storage).resolve() / "data" / f"{defaults.dataset}-demo")


def write_demo_data(root: str, defaults: DatasetDefaults) -> None:
    """Write the synthetic demo data set once (atomically, so an existing folder is complete;
    later demo sweeps reuse it)."""
    if not Path(root).exists():
        benchmark(defaults.dataset).synthetic.write(Path(root), seed=0, **defaults.demo_data)


def wants_gpus(args: argparse.Namespace) -> bool:
    return (args.gpus_per_trial or 0) > 0 or (args.gpus_per_trial is None and args.num_gpus > 0)


def base_config(
    args: argparse.Namespace, defaults: DatasetDefaults, root: str, use_gpu: bool | None = None
) -> dict:
    """The ExperimentConfig dict shared by every trial of the sweep (validated); `use_gpu`
    defaults to what the resource flags ask for. Each layer overrides the ones before: the data
    set's defaults, --demo, --config, --set, the named flags."""
    use_gpu = wants_gpus(args) if use_gpu is None else use_gpu
    config = apply_overrides(ExperimentConfig().to_dict(), dataset_fields(defaults))
    if args.demo:
        config = apply_overrides(config, demo_fields(args, defaults))
    layers = [
        (f"--config {args.config}", read_config_file(args.config) if args.config else {}),
        ("--set", parse_set(args.set)),
        ("flags", flag_fields(args)),
    ]
    for source, fields in layers:
        config = apply_overrides(config, fields)
        if fields:
            check_config(config, source)
    config["data"] = {"dataset": defaults.dataset, "root": root}
    # "auto": CUDA when the trial's worker sees a GPU, else CPU (logical GPUs in tests).
    config["device"] = "auto" if use_gpu else "cpu"
    config["model"]["pretrained"] = pretrained_weights(config["model"]["pretrained"])
    ExperimentConfig.from_dict(config)
    return config


def dataset_fields(defaults: DatasetDefaults) -> dict[str, Any]:
    """The data set's budget and settings as dotted config fields."""
    return {
        **defaults.config,
        "model.backbone": defaults.backbone,
        "train.epochs": defaults.epochs,
        "train.batch_size": defaults.batch_size,
        "train.lr": defaults.lr,
    }


def demo_fields(args: argparse.Namespace, defaults: DatasetDefaults) -> dict[str, Any]:
    """The --demo budget and settings as dotted config fields: its step budget unless
    --epochs/--steps give one, and the controller's warmup scaled to it (`demo_controller`)."""
    demo = defaults.demo_train
    fields = {
        **defaults.demo_config,
        "train.batch_size": demo["batch_size"],
        "train.lr": demo["lr"],
    }
    if "backbone" in demo:
        fields["model.backbone"] = demo["backbone"]
    if args.epochs is None and args.steps is None:  # a demo budget in steps, or in epochs
        fields["train.epochs"] = demo.get("epochs")
        fields["train.max_steps"] = demo.get("steps")
    scaled = demo_controller(args, defaults)
    if scaled is not None:
        fields["relif.warmup_steps"] = scaled[1]
    return fields


def flag_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields the named flags give (those not given set nothing). --steps alone
    trains exactly that many steps, so it clears the epoch budget."""
    given = {
        "model.backbone": args.backbone,
        "model.pretrained": args.pretrained,
        "train.epochs": args.epochs,
        "train.max_steps": args.steps,
        "train.batch_size": args.batch_size,
        "train.lr": args.lr,
        "train.precision": args.precision,
        "train.channels_last": args.channels_last,
        "train.compile": args.compile,
        "relif.warmup_steps": args.warmup_steps,
    }
    fields = {field: value for field, value in given.items() if value is not None}
    if args.steps is not None and args.epochs is None:
        fields["train.epochs"] = None
    return fields


def check_config(config: dict, source: str) -> None:
    """The config after one layer of overrides must be valid; the error names the layer."""
    try:
        ExperimentConfig.from_dict(config)
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None


def pretrained_weights(value: str) -> str:
    """model.pretrained as the trials will read it: none, imagenet, or the absolute path of a
    state_dict file that exists here (the driver checks it before any trial starts)."""
    if value in ("none", "imagenet"):
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise UserError(f"model.pretrained: no such state_dict file: {value}")
    return str(path.resolve())


def controller_grid(
    args: argparse.Namespace, defaults: DatasetDefaults
) -> tuple[list[float], list[float]]:
    """(r* values, eta values) of the grid: the flags, else the data set's (for --demo, eta
    scaled to the demo's step budget, `demo_controller`)."""
    scaled = demo_controller(args, defaults)
    eta = f"{scaled[0] if scaled else defaults.eta:g}" if args.eta is None else args.eta
    r_star = f"{defaults.r_star:g}" if args.r_star is None else args.r_star
    return parse_floats(r_star, "--r-star"), parse_floats(eta, "--eta")


def demo_steps(args: argparse.Namespace, defaults: DatasetDefaults) -> int | None:
    """--steps, or the demo's step budget when --demo is given without --epochs/--steps."""
    if args.steps is None and args.epochs is None and args.demo:
        return defaults.demo_train.get("steps")
    return args.steps


def demo_controller(
    args: argparse.Namespace, defaults: DatasetDefaults
) -> tuple[float, int] | None:
    """(eta, warmup) of a --demo sweep: `relif_ray.relif.controller.scale_to_budget` of its
    step budget, so lambda moves as far as in the paper's 200-epoch NYUv2 run (eta x steps and
    warmup / steps kept); None outside --demo, without a step budget (--epochs) or with a
    --steps that is not positive (the config check then refuses it in one line, as it does
    without --demo)."""
    steps = demo_steps(args, defaults)
    if not args.demo or steps is None or steps <= 0 or args.epochs is not None:
        return None
    return scale_to_budget(steps, defaults.eta)


def check_delta(delta: float) -> None:
    if not 0.0 <= delta <= 1.0:
        raise UserError(f"--delta: must be in [0, 1], got {delta:g}")


def experiment_name(args: argparse.Namespace, defaults: DatasetDefaults, suffix: str = "") -> str:
    name = args.name or f"{defaults.dataset}{suffix}{'-demo' if args.demo else ''}"
    if "/" in name or name.startswith("."):
        raise UserError(f"--name: must be a plain folder name, got '{name}'")
    return name


def seeds_of(args: argparse.Namespace, defaults: DatasetDefaults) -> list[int]:
    default = defaults.demo_train["seeds"] if args.demo else defaults.seeds
    return parse_seeds(args.seeds or str(default))


def parse_callbacks(text: str) -> tuple[str, ...]:
    """`--callbacks wandb,mlflow`: known names whose package is installed (Ray's integrations
    import them only when a trial starts)."""
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    for name in names:
        if name not in LOGGER_CALLBACKS:
            raise UserError(
                f"--callbacks: unknown logger '{name}' (known: {', '.join(LOGGER_CALLBACKS)})"
            )
        if importlib.util.find_spec(LOGGER_CALLBACKS[name]) is None:
            raise UserError(
                f"--callbacks {name}: the {LOGGER_CALLBACKS[name]} package is not installed "
                f"(pip install 'relif-ray[{name}]')"
            )
    return names


def tune_options(args: argparse.Namespace, base: dict | None) -> TuneOptions:
    """The scheduling and logging flags; ASHA's horizon is the trials' epochs."""
    if args.max_concurrent_trials is not None and args.max_concurrent_trials <= 0:
        raise UserError(f"--max-concurrent-trials: must be > 0, got {args.max_concurrent_trials}")
    return TuneOptions(
        scheduler=args.scheduler,
        scheduler_metric=args.scheduler_metric,
        asha_max_epochs=base["train"]["epochs"] if base else None,
        max_concurrent_trials=args.max_concurrent_trials,
        callbacks=parse_callbacks(args.callbacks),
    )


def launch(
    args: argparse.Namespace,
    defaults: DatasetDefaults,
    name: str,
    plan: Callable[[dict], tuple[SweepSpace, OptunaPlan | None]],
) -> str:
    """Validate, then run (or resume) the sweep. `plan(base)` returns (the sweep's
    `SweepSpace`, OptunaPlan or None) for the validated base config."""
    limits = resources(args)
    check_delta(args.delta)
    if not limits.address:
        from relif_ray.tuning import keep_local_ray_on_loopback

        keep_local_ray_on_loopback()
    from relif_ray.tuning import launch as ray_launch  # Ray is imported from here on

    if args.resume:
        with exclusive_experiment(args.storage, name):
            return ray_launch.run_sweep(
                None,
                name=name,
                storage=args.storage,
                resources=limits,
                max_failures=args.max_failures,
                keep_checkpoints=args.keep_checkpoints,
                resume=True,
                search=None,
            )
    root = data_root(args, defaults)
    base = base_config(args, defaults, root, limits.gpus_per_trial > 0)
    options = tune_options(args, base)
    space, search = plan(base)
    check_storage(args.storage)
    if args.reference:
        lent_constants(args.reference)  # before Ray starts; run_sweep copies them in
    writes_demo_data = args.demo and not args.data_dir
    if not writes_demo_data:
        check_data(defaults.dataset, root)
    with exclusive_experiment(args.storage, name):
        prepare_new_experiment(args.storage, name, replace=args.demo)
        if writes_demo_data:
            write_demo_data(root, defaults)
        experiment_dir = ray_launch.run_sweep(
            space,
            name=name,
            storage=args.storage,
            resources=limits,
            max_failures=args.max_failures,
            keep_checkpoints=args.keep_checkpoints,
            checkpoint_every=0 if args.demo else 1,
            checkpoint_interval_s=args.checkpoint_interval,
            search=search,
            options=options,
            reference=args.reference,
        )
    if defaults.delta_ref is not None:
        print(f"fixed-delta audit threshold of the paper: delta_ref = {defaults.delta_ref:g}")
    return experiment_dir


def run(
    argv: list[str] | None, defaults: DatasetDefaults, dataset_choices: tuple[str, ...] = ()
) -> str:
    """`sweeps/<dataset>.py`: methods x seeds x (r*, eta), or Optuna studies. With
    `dataset_choices`, `--dataset` picks the defaults among `DATASETS`."""
    if dataset_choices:
        defaults = DATASETS[choose_dataset(argv, defaults, dataset_choices)]
    args = build_parser(defaults, dataset_choices).parse_args(argv)
    seeds = seeds_of(args, defaults)
    optuna = args.search == "optuna"
    default = defaults.demo_train["methods"] if args.demo else default_methods()
    labels = parse_labels(args.methods or ("relif" if optuna else default))
    r_stars, etas = controller_grid(args, defaults)
    if optuna:
        plan = optuna_plan(args, labels, seeds)
    chosen = selection_of(args) if args.select_from and not args.resume else None
    if chosen is not None:
        trials = selected_trials(labels, seeds, settings_of(chosen), args.select_from)
        chosen = chosen[chosen["label"].isin(labels) & chosen["seed"].isin(seeds)]
        print_selection(chosen, args.select_worst_tolerance)
    name = experiment_name(args, defaults)

    def grid(base: dict) -> tuple[SweepSpace, OptunaPlan | None]:
        if optuna:
            return plan.space(base, args.delta), plan
        if chosen is not None:
            return trial_space(base, trials, args.delta), None
        return param_space(base, grid_variants(labels, r_stars, etas), seeds, args.delta), None

    experiment_dir = launch(args, defaults, name, grid)
    if chosen is not None:
        record_selection(experiment_dir, chosen, args)
    return experiment_dir


def selection_of(args: argparse.Namespace) -> pd.DataFrame:
    """The (r*, eta) chosen per label and seed from the `--select-from` search (after the
    flags that would contradict it are refused)."""
    for flag, value in (("--r-star", args.r_star), ("--eta", args.eta)):
        if value is not None:
            raise UserError(
                f"--select-from: conflicts with {flag} (it selects r* and eta per seed)"
            )
    if args.search == "optuna":
        raise UserError(
            "--select-from: conflicts with --search optuna (it runs the selected setting)"
        )
    return select_settings(read_pareto(args.select_from), args.select_worst_tolerance)


def settings_of(chosen: pd.DataFrame) -> dict[tuple[str, int], tuple[float, float]]:
    return {
        (row.label, int(row.seed)): (float(row.r_star), float(row.eta))
        for row in chosen.itertuples()
    }


def print_selection(chosen: pd.DataFrame, tolerance: float) -> None:
    print(
        "(r*, eta) selected on validation: lowest val Bias within "
        f"{tolerance:g} of the study's best val Worst"
    )
    for row in chosen.itertuples():
        print(
            f"  {row.label} seed {int(row.seed)}: r*={row.r_star:g} eta={row.eta:g} "
            f"(val Bias {row.val_bias:.4f}, val Worst {row.val_worst:.4f}; "
            f"study {row.study}, trial {row.trial_id})"
        )


def record_selection(experiment_dir: str, chosen: pd.DataFrame, args: argparse.Namespace) -> None:
    """`<experiment>/selection.csv`: the chosen pareto.csv rows, their source and tolerance."""
    table = chosen.assign(source=args.select_from, worst_tolerance=args.select_worst_tolerance)
    path = storage.join(storage.location(experiment_dir), SELECTION_FILE)
    storage.write_text(path, table.to_csv(index=False))


def optuna_plan(args: argparse.Namespace, labels: list[str], seeds: list[int]) -> OptunaPlan:
    others = [label for label in labels if not uses_controller(label)]
    if others:
        raise UserError(
            f"--search optuna: tunes the ReLiF controller's (r*, eta); '{others[0]}' does not "
            "use them (run it in a grid sweep)"
        )
    if args.num_samples <= 0:
        raise UserError(f"--num-samples: must be > 0, got {args.num_samples}")
    r_range = parse_range(args.r_star_range, "--r-star-range")
    if not 0.0 <= r_range[0] < r_range[1] <= 1.0:
        raise UserError(f"--r-star-range: r* bounds must lie in [0, 1], got '{args.r_star_range}'")
    return OptunaPlan(
        labels=labels,
        seeds=seeds,
        num_samples=args.num_samples,
        r_star_range=r_range,
        eta_range=parse_range(args.eta_range, "--eta-range", positive=True),
    )


def choose_dataset(
    argv: list[str] | None, defaults: DatasetDefaults, choices: tuple[str, ...]
) -> str:
    """The `--dataset` of `argv` (its defaults decide the other flags' defaults)."""
    chooser = OneLineParser(add_help=False)
    chooser.add_argument("--dataset", choices=choices, default=defaults.dataset)
    return chooser.parse_known_args(argv)[0].dataset


def run_controller_sensitivity(argv: list[str] | None, defaults: DatasetDefaults) -> str:
    """`sweeps/controller_sensitivity.py`: the controller checks on any data set."""
    choices = tuple(DATASETS)
    defaults = DATASETS[choose_dataset(argv, defaults, choices)]
    parser = build_parser(
        defaults,
        choices,
        description="ReLiF controller sensitivity: eta and r* sweeps and a static-lambda grid, "
        "x seeds.",
        grid_flags=False,
    )
    checks = parser.add_argument_group("controller checks")
    checks.add_argument("--etas", default=CONTROLLER_ETAS, help="eta values of the eta check")
    checks.add_argument("--eta-r-star", type=float, default=0.16, help="r* of the eta check")
    checks.add_argument("--r-stars", default=CONTROLLER_R_STARS, help="r* values of the r* check")
    checks.add_argument(
        "--r-star-eta", type=float, default=defaults.eta, help="eta of the r* check"
    )
    checks.add_argument(
        "--static-lambdas", default=STATIC_LAMBDAS, help="lambda values of the static grid"
    )
    args = parser.parse_args(argv)
    seeds = seeds_of(args, defaults)
    variants = controller_variants(
        args.eta_r_star,
        parse_floats(args.etas, "--etas"),
        parse_floats(args.r_stars, "--r-stars"),
        args.r_star_eta,
        parse_floats(args.static_lambdas, "--static-lambdas"),
    )
    name = experiment_name(args, defaults, suffix="-controller")

    def grid(base: dict) -> tuple[SweepSpace, OptunaPlan | None]:
        return param_space(base, variants, seeds, args.delta), None

    return launch(args, defaults, name, grid)


def clinical_main(argv: list[str] | None = None) -> int:
    """`sweeps/clinical.py --dataset mimic3|eicu ...`: the same sweep with that data set's
    defaults (MIMIC-III: 7 seeds, delta_ref 0.275; eICU: 3 seeds, delta_ref 0.06)."""
    return main(MIMIC3, argv, runner=run_clinical)


def run_clinical(argv: list[str] | None, defaults: DatasetDefaults) -> str:
    return run(argv, defaults, tuple(CLINICAL))


def main(
    defaults: DatasetDefaults,
    argv: list[str] | None = None,
    runner: Callable[[list[str] | None, DatasetDefaults], str] = run,
) -> int:
    """Entry point of a sweep script: exit 0 with the experiment directory when every trial
    terminated, 2 on a user mistake found before Ray starts (one line on stderr), or 1 when
    trials errored (their summary and the retry command close stderr)."""
    try:
        experiment_dir = runner(argv, defaults)
    except UserError as exc:
        print(f"{Path(sys.argv[0]).name}: error: {exc}", file=sys.stderr)
        return 2
    except TrialsErrored as failure:
        print(f"experiment directory: {failure.experiment_dir}")
        retry = retry_command([sys.executable, sys.argv[0]], sys.argv[1:] if argv is None else argv)
        print("\n".join(summary_lines(failure, retry)), file=sys.stderr)
        return EXIT_TRIALS_ERRORED
    print(f"experiment directory: {experiment_dir}")
    return 0
