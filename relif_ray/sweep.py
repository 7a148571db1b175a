"""Command-line sweeps: parse flags, build the grid, launch it on Ray Tune.

`sweeps/nyuv2.py` (and later `sweeps/clinical.py`) are thin wrappers around `main`. Flags are
validated before Ray starts; user mistakes exit with status 2 and a one-line message.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relif_ray.config import ExperimentConfig
from relif_ray.errors import UserError


@dataclass(frozen=True)
class DatasetDefaults:
    """What differs between data sets: budget, model and demo sizes."""

    dataset: str
    seeds: int
    backbone: str
    batch_size: int
    lr: float
    demo_data: dict[str, int]
    demo_train: dict[str, Any]


NYUV2 = DatasetDefaults(
    dataset="nyuv2",
    seeds=7,
    backbone="resnet50",
    batch_size=8,
    lr=1e-4,
    demo_data={"train": 48, "val": 24, "height": 48, "width": 64},
    demo_train={"epochs": 4, "batch_size": 8, "lr": 1e-3, "backbone": "resnet18", "seeds": 2},
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
    return values


def parse_floats(text: str, flag: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"{flag}: expected comma-separated numbers, got '{text}'") from None


def build_parser(defaults: DatasetDefaults) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=f"Ray Tune sweep of MTL methods x seeds on {defaults.dataset}.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
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
    parser.add_argument("--r-star", default="0.24", help="ReLiF controller targets (list)")
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
    """Write (once) the synthetic demo data set next to the experiments."""
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2

    root = Path(storage) / "data" / f"{defaults.dataset}-demo"
    if not (root / "train").is_dir():
        write_synthetic_nyuv2(root, seed=0, **defaults.demo_data)
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


def run(argv: list[str] | None, defaults: DatasetDefaults) -> Path:
    args = build_parser(defaults).parse_args(argv)
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


def main(defaults: DatasetDefaults, argv: list[str] | None = None) -> int:
    try:
        experiment_dir = run(argv, defaults)
    except UserError as exc:
        print(f"{Path(sys.argv[0]).name}: error: {exc}", file=sys.stderr)
        return 2
    print(f"experiment directory: {experiment_dir}")
    return 0
