"""Command-line sweeps: parse flags, build the grid, launch it on Ray Tune.

`sweeps/nyuv2.py` and `sweeps/clinical.py` are thin wrappers around `main`. Flags are
validated before Ray starts; user mistakes exit with status 2 and a one-line message.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relif_ray.config import ExperimentConfig
from relif_ray.errors import UserError


@dataclass(frozen=True)
class DatasetDefaults:
    """What differs between data sets: budget, model, demo sizes and audit threshold.

    demo_data: keyword arguments of the data set's synthetic writer (`cli_data.DATA_WRITERS`).
    config: dotted ExperimentConfig fields set for every trial before the flags apply (the
        paper's settings, e.g. {"train.optimizer": "adamw"}); demo_config: the same in --demo.
    r_star: default of --r-star (the paper's controller target for this data set).
    delta_ref: the paper's held-fixed audit threshold where it is one number (MIMIC-III 0.275,
        eICU 0.06); NYUv2 takes quantiles of a reference run instead (None).
    """

    dataset: str
    seeds: int
    backbone: str
    batch_size: int
    lr: float
    demo_data: dict[str, int]
    demo_train: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    demo_config: dict[str, Any] = field(default_factory=dict)
    r_star: str = "0.24"
    delta_ref: float | None = None


NYUV2 = DatasetDefaults(
    dataset="nyuv2",
    seeds=7,
    backbone="resnet50",
    batch_size=8,
    lr=1e-4,
    demo_data={"train": 48, "val": 24, "height": 48, "width": 64},
    demo_train={"epochs": 4, "batch_size": 8, "lr": 1e-3, "backbone": "resnet18", "seeds": 2},
)

CLINICAL_CONFIG = {
    "train.optimizer": "adamw",
    "train.weight_decay": 1e-5,
    "train.grad_clip": 1.0,
    "train.eval_batch_size": 64,
    "model.hidden_size": 256,
    "model.num_layers": 2,
    "model.dropout": 0.3,
}
"""The paper's clinical setting: 2-layer LSTM (256, dropout 0.3), AdamW, wd 1e-5, clip 1.0."""

CLINICAL_DEMO = {"epochs": 3, "batch_size": 16, "lr": 3e-3, "seeds": 2}

MIMIC3 = DatasetDefaults(
    dataset="mimic3",
    seeds=7,
    backbone="lstm",
    batch_size=64,
    lr=1e-3,
    demo_data={"patients": 150},
    demo_train=CLINICAL_DEMO,
    config=CLINICAL_CONFIG,
    demo_config={"model.hidden_size": 32},
    r_star="0.16",
    delta_ref=0.275,
)
"""MIMIC-III: 7 seeds, delta_ref 0.275. The paper selects (r*, eta) on validation; pass a grid
with --r-star/--eta (its controller checks span r* 0.16-0.28, eta 1e-4-1e-2)."""

EICU = DatasetDefaults(
    dataset="eicu",
    seeds=3,
    backbone="lstm",
    batch_size=64,
    lr=1e-3,
    demo_data={"patients": 200},
    demo_train=CLINICAL_DEMO,
    config=CLINICAL_CONFIG,
    demo_config={"model.hidden_size": 32},
    r_star="0.16",
    delta_ref=0.06,
)
"""eICU: 3 seeds, r* 0.16 and eta 1e-3 as in the paper, delta_ref 0.06."""

CLINICAL = {"mimic3": MIMIC3, "eicu": EICU}


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
    return values


def parse_floats(text: str, flag: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"{flag}: expected comma-separated numbers, got '{text}'") from None


def build_parser(
    defaults: DatasetDefaults, dataset_choices: tuple[str, ...] = ()
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=f"Ray Tune sweep of MTL methods x seeds on {defaults.dataset}.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    if dataset_choices:
        parser.add_argument(
            "--dataset", choices=dataset_choices, default=defaults.dataset, help="data set"
        )
    parser.add_argument("--data-dir", help="data set root (the real data or `relif make-data`)")
    parser.add_argument(
        "--demo", action="store_true", help="small synthetic data and budget; runs in minutes"
    )
    parser.add_argument("--methods", default="erm,relif", help="comma-separated method labels")
    parser.add_argument(
        "--seeds",
        help=f"a count (0..N-1) or a list like 0,3,5 (default: {defaults.seeds}; demo: "
        f"{defaults.demo_train['seeds']})",
    )
    parser.add_argument("--epochs", type=int, help="epochs per trial")
    parser.add_argument("--steps", type=int, help="cap on optimisation steps per trial")
    parser.add_argument("--batch-size", type=int, help="training batch size")
    parser.add_argument("--lr", type=float, help="learning rate")
    parser.add_argument("--backbone", help="model backbone")
    parser.add_argument("--r-star", default=defaults.r_star, help="ReLiF controller targets (list)")
    parser.add_argument("--eta", default="0.001", help="ReLiF controller step sizes (list)")
    parser.add_argument("--warmup-steps", type=int, help="ReLiF controller warmup steps")
    parser.add_argument("--storage", default="relif-results", help="experiment storage root")
    parser.add_argument("--name", help="experiment name (default: <dataset> or <dataset>-demo)")
    parser.add_argument("--num-gpus", type=float, default=0, help="GPUs the sweep may use")
    parser.add_argument("--gpus-per-trial", type=float, default=0, help="GPUs per trial")
    parser.add_argument("--cpus-per-trial", type=float, default=1, help="CPUs per trial")
    parser.add_argument("--num-cpus", type=int, help="CPUs for local Ray (default: all)")
    parser.add_argument("--address", help="existing Ray cluster address (default: local Ray)")
    parser.add_argument("--max-failures", type=int, default=2, help="restarts per trial")
    parser.add_argument("--resume", action="store_true", help="continue a killed sweep")
    return parser


def base_config(args: argparse.Namespace, defaults: DatasetDefaults, data_dir: str) -> dict:
    """The ExperimentConfig shared by every trial of the sweep."""
    demo = defaults.demo_train if args.demo else {}
    config = ExperimentConfig().to_dict()
    set_fields(config, defaults.config)
    if args.demo:
        set_fields(config, defaults.demo_config)
    config["data"] = {"dataset": defaults.dataset, "root": str(Path(data_dir).resolve())}
    config["device"] = "cuda" if args.gpus_per_trial > 0 else "cpu"
    config["model"]["backbone"] = args.backbone or demo.get("backbone", defaults.backbone)
    train = config["train"]
    train["epochs"] = args.epochs or demo.get("epochs", train["epochs"])
    train["max_steps"] = args.steps
    train["batch_size"] = args.batch_size or demo.get("batch_size", defaults.batch_size)
    train["lr"] = args.lr or demo.get("lr", defaults.lr)
    if args.warmup_steps is not None:
        config["relif"]["warmup_steps"] = args.warmup_steps
    elif args.demo:
        config["relif"]["warmup_steps"] = 5
    ExperimentConfig.from_dict(config)  # fail here, before Ray starts, on bad values
    return config


def set_fields(config: dict[str, Any], values: dict[str, Any]) -> None:
    """Set dotted fields ("train.optimizer") of a nested config dict in place."""
    for dotted, value in values.items():
        section, _, name = dotted.rpartition(".")
        target = config
        for key in filter(None, section.split(".")):
            target = target[key]
        target[name] = value


def check_resources(args: argparse.Namespace) -> None:
    if args.gpus_per_trial < 0 or args.num_gpus < 0 or args.cpus_per_trial <= 0:
        raise UserError("--num-gpus/--gpus-per-trial must be >= 0 and --cpus-per-trial > 0")
    if args.gpus_per_trial > 0 and args.num_gpus <= 0 and not args.address:
        raise UserError("--gpus-per-trial: trials ask for GPUs but --num-gpus is 0")
    if args.gpus_per_trial > max(args.num_gpus, 0) and not args.address:
        raise UserError(
            f"--gpus-per-trial {args.gpus_per_trial} exceeds --num-gpus {args.num_gpus}: "
            "no trial could ever start"
        )


def prepare_demo_data(defaults: DatasetDefaults, storage: str) -> str:
    """Write (once) the synthetic demo data set next to the experiments (written atomically,
    so an existing folder is complete)."""
    from relif_ray.cli_data import DATA_WRITERS

    root = Path(storage) / "data" / f"{defaults.dataset}-demo"
    if not root.exists():
        DATA_WRITERS[defaults.dataset].write(root, seed=0, **defaults.demo_data)
    return str(root)


def prepare_experiment_dir(storage: str, name: str, demo: bool, resume: bool) -> None:
    """Refuse to mix a new sweep into an existing experiment; `--demo` replaces its own."""
    path = Path(storage) / name
    if "://" in storage or resume or not path.exists():
        return
    if not demo:
        raise UserError(
            f"--name: experiment {path} already exists (use --resume to continue it, "
            "or another --name)"
        )
    shutil.rmtree(path)


def run(
    argv: list[str] | None, defaults: DatasetDefaults, dataset_choices: tuple[str, ...] = ()
) -> Path:
    args = build_parser(defaults, dataset_choices).parse_args(argv)
    check_resources(args)
    default_seeds = defaults.demo_train["seeds"] if args.demo else defaults.seeds
    seeds = parse_seeds(args.seeds or str(default_seeds))
    labels = [label.strip() for label in args.methods.split(",") if label.strip()]
    if args.demo and not args.data_dir:
        data_dir = prepare_demo_data(defaults, args.storage)
    elif args.data_dir:
        data_dir = args.data_dir
        if not Path(data_dir).is_dir():
            raise UserError(f"--data-dir: no such directory: {data_dir}")
    else:
        raise UserError("--data-dir is required (or use --demo for synthetic data)")
    base = base_config(args, defaults, data_dir)

    from relif_ray import tune as relif_tune  # Ray is imported only from here on
    from relif_ray.methods import METHODS

    for label in labels:
        method = label.partition("+")[0]
        if label != "relif" and method not in METHODS:
            raise UserError(f"--methods: unknown method '{method}' (known: {', '.join(METHODS)})")
    variants = relif_tune.grid_variants(
        labels, parse_floats(args.r_star, "--r-star"), parse_floats(args.eta, "--eta")
    )
    name = args.name or (f"{defaults.dataset}-demo" if args.demo else defaults.dataset)
    prepare_experiment_dir(args.storage, name, args.demo, args.resume)
    return relif_tune.run_sweep(
        relif_tune.param_space(base, variants, seeds),
        name=name,
        storage=args.storage,
        num_cpus=args.num_cpus,
        num_gpus=args.num_gpus,
        cpus_per_trial=args.cpus_per_trial,
        gpus_per_trial=args.gpus_per_trial,
        address=args.address,
        max_failures=args.max_failures,
        resume=args.resume,
    )


def main(
    defaults: DatasetDefaults,
    argv: list[str] | None = None,
    dataset_choices: tuple[str, ...] = (),
) -> int:
    try:
        experiment_dir = run(argv, defaults, dataset_choices)
    except UserError as exc:
        print(f"{Path(sys.argv[0]).name}: error: {exc}", file=sys.stderr)
        return 2
    print(f"experiment directory: {experiment_dir}")
    if defaults.delta_ref is not None:
        print(f"fixed-delta audit threshold of the paper: delta_ref = {defaults.delta_ref:g}")
    return 0


def clinical_main(argv: list[str] | None = None) -> int:
    """`sweeps/clinical.py --dataset mimic3|eicu ...`: the same sweep with that data set's
    defaults (MIMIC-III: 7 seeds, delta_ref 0.275; eICU: 3 seeds, delta_ref 0.06)."""
    chooser = argparse.ArgumentParser(add_help=False)
    chooser.add_argument("--dataset", choices=tuple(CLINICAL), default="mimic3")
    known, _ = chooser.parse_known_args(argv)
    return main(CLINICAL[known.dataset], argv, dataset_choices=tuple(CLINICAL))
