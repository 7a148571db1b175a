"""The flags of a sweep (`relif sweep` and `sweeps/*.py`), with the chosen data set's defaults.

Groups: data and budget; the grid (or, for the controller checks, their grids); config
fields; resources, storage and recovery; Tune scheduling and logging. What the flags mean
once parsed is read in `relif_ray.cli.sweep`.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from relif_ray.cli.parsing import DefaultsHelpFormatter, OneLineParser, comma_list, parse_floats
from relif_ray.errors import UserError, install_hint
from relif_ray.experiment.record import SCHEDULER_METRICS, WORST
from relif_ray.models.architectures import known_architecture
from relif_ray.problems import DatasetDefaults
from relif_ray.sweep.labels import PAPER_LABELS, RELIF_LABELS
from relif_ray.sweep.plan import (
    CONTROLLER_ETAS,
    CONTROLLER_R_STARS,
    GPUS_PER_TRIAL,
    LOGGER_CALLBACKS,
    STATIC_LAMBDAS,
)
from relif_ray.sweep.request import CHECKPOINT_INTERVAL_S

CHECKS_SUFFIX = "-controller"
"""What the controller checks' sweep appends to the data set's name for its experiment."""

CHECKS_DESCRIPTION = (
    "ReLiF controller sensitivity: eta and r* sweeps and a static-lambda grid, x seeds."
)


def default_methods() -> str:
    """The paper's methods (`PAPER_LABELS`), comma-separated."""
    return ",".join(PAPER_LABELS)


def build_parser(
    defaults: DatasetDefaults,
    dataset_choices: tuple[str, ...] = (),
    *,
    checks: bool = False,
    offer_checks: bool = False,
    prog: str | None = None,
) -> OneLineParser:
    """The flags of a sweep on `defaults`' data set. Several `dataset_choices` add --dataset;
    `checks` replaces the grid flags by those of the paper's controller checks;
    `offer_checks` adds --controller-checks, which chooses between the two (`relif sweep`)."""
    description = (
        CHECKS_DESCRIPTION
        if checks
        else (f"Ray Tune sweep of MTL methods x seeds (x ReLiF settings) on {defaults.dataset}.")
    )
    parser = OneLineParser(
        prog=prog, description=description, formatter_class=DefaultsHelpFormatter
    )
    add_data_flags(parser, defaults, dataset_choices)
    if not checks:
        add_grid_flags(parser, defaults, offer_checks)
    add_config_flags(parser)
    add_launch_flags(parser, defaults, checks)
    add_tune_flags(parser)
    if checks:
        add_check_flags(parser, defaults, offer_checks)
    return parser


def add_data_flags(
    parser: argparse.ArgumentParser, defaults: DatasetDefaults, dataset_choices: tuple[str, ...]
) -> None:
    data = parser.add_argument_group("data and budget")
    if len(dataset_choices) > 1:
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
        "--fused-seeds",
        type=int,
        help="train this many seeds of each setting in step in one trial, each seed still "
        "its own row and its own numbers (train.fused_seeds; default 1: a trial per seed; "
        "CPU grid sweeps without ASHA)",
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
        help="ReLiF controller warmup steps (default: the paper's 100 where the paper fixes "
        "eta for the data set and budget, else warmup / steps as in the paper's NYUv2 run, "
        "scale_to_budget of the trials' step budget)",
    )
    data.add_argument(
        "--delta",
        type=float,
        default=defaults.delta,
        help="threshold of the live validation Bias (progress table, Optuna objective)",
    )


def add_grid_flags(
    parser: argparse.ArgumentParser, defaults: DatasetDefaults, offer_checks: bool
) -> None:
    grid = parser.add_argument_group("grid")
    grid.add_argument(
        "--methods",
        help="comma-separated labels: registered methods, "
        f"{', '.join(RELIF_LABELS)}, or <method>+<ReLiF label> (default: the paper's "
        f"{default_methods()}; demo: {defaults.demo_train['methods']}; with --search optuna: "
        "relif); `relif methods` lists every method, e.g. --methods erm,upgrad,upgrad+relif",
    )
    add_architectures_flag(grid)
    grid.add_argument(
        "--r-star", help=f"ReLiF controller targets (list) (default: {defaults.r_star:g})"
    )
    grid.add_argument(
        "--eta",
        help=f"ReLiF controller step sizes (list) (default: {defaults.eta:g} where the paper "
        "fixes it for the data set and budget, else eta x steps as in the paper's 200-epoch "
        "NYUv2 run, scale_to_budget of the trials' step budget; the sweep prints it)",
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
        help="--select-from: how far below the study's best validation Worst a chosen point may be",
    )
    if offer_checks:
        add_controller_checks_flag(grid, among_checks=False)


def add_architectures_flag(grid: argparse._ArgumentGroup) -> None:
    """`--architectures`: an axis of the grid (`parse_architectures`)."""
    grid.add_argument(
        "--architectures",
        metavar="NAMES",
        help="comma-separated model.architecture values to cross with the grid, e.g. "
        "hps,mtan (default: the config's one, hps unless set); `relif architectures` lists them",
    )


def add_controller_checks_flag(group: argparse._ActionsContainer, among_checks: bool) -> None:
    """`--controller-checks` (`relif sweep`), which chooses between a grid and the paper's
    controller checks, declared here only: read first by `relif_ray.cli.sweep.choose` (which
    shows no help), then listed with the flags of either; among the grid's (`among_checks`
    False) its help points at the checks' own flags."""
    help_text = (
        "run the controller checks"
        if among_checks
        else "run the paper's controller checks instead of a grid (their flags: "
        "--controller-checks --help)"
    )
    group.add_argument("--controller-checks", action="store_true", help=help_text)


def add_check_flags(
    parser: argparse.ArgumentParser, defaults: DatasetDefaults, offer_checks: bool
) -> None:
    """The paper's controller checks (appendix "Controller sensitivity"), `relif_ray.sweep.plan
    .controller_variants`."""
    checks = parser.add_argument_group("controller checks")
    if offer_checks:
        add_controller_checks_flag(checks, among_checks=True)
    checks.add_argument("--etas", default=CONTROLLER_ETAS, help="eta values of the eta check")
    checks.add_argument("--eta-r-star", type=float, default=0.16, help="r* of the eta check")
    checks.add_argument("--r-stars", default=CONTROLLER_R_STARS, help="r* values of the r* check")
    checks.add_argument(
        "--r-star-eta", type=float, default=defaults.eta, help="eta of the r* check"
    )
    checks.add_argument(
        "--static-lambdas", default=STATIC_LAMBDAS, help="lambda values of the static grid"
    )
    checks.add_argument(
        "--label",
        default="relif",
        help="ReLiF label of the eta and r* checks, one that adapts lambda (e.g. relif-st, "
        "pcgrad+relif); the static grid stays relif-static",
    )


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
        "--gpu-fast-path",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="trials that get a GPU run the data set's fast path (NYUv2: bf16 forward, "
        "channels-last, data on the GPU, the step as one CUDA graph where the method allows); "
        "--no-gpu-fast-path: fp32, NCHW, batches from the host, eager steps",
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
        default=WORST,
        help="what ASHA ranks by: worst, macro (validation, max) or val_bias (min)",
    )
    tune.add_argument("--max-concurrent-trials", type=int, help="at most this many trials at once")
    tune.add_argument(
        "--callbacks",
        help="Ray's logger integrations: wandb, mlflow or wandb,mlflow (TensorBoard and "
        "CSV/JSON are always written)",
    )


def add_launch_flags(
    parser: argparse.ArgumentParser, defaults: DatasetDefaults, checks: bool = False
) -> None:
    """Resources, storage and recovery; `checks`: the controller checks' sweep, whose default
    experiment name is `<dataset>-controller` (`relif_ray.cli.sweep.experiment_name`)."""
    name = f"{defaults.dataset}{CHECKS_SUFFIX if checks else ''}"
    launch = parser.add_argument_group("resources, storage, recovery")
    launch.add_argument(
        "--num-gpus", type=float, default=0, help="GPUs the sweep may use in total (0 = CPU)"
    )
    launch.add_argument(
        "--gpus-per-trial",
        type=float,
        help="GPUs per trial; fractions pack trials (0.5 = two per GPU) "
        f"(default: {GPUS_PER_TRIAL:g} if --num-gpus > 0, else 0)",
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
    launch.add_argument("--name", help=f"experiment name (default: {name}; demo: {name}-demo)")
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
        "--resume-if-present",
        action="store_true",
        help="continue the sweep --name in --storage if it exists there (as --resume), else "
        "start it: one command for a job that is requeued after a stop",
    )
    launch.add_argument(
        "--reference",
        metavar="EXPERIMENT",
        help="take the same-seed ERM squash constants that ReLiF trains on from this finished "
        "experiment (directory or URI) instead of running ERM reference trials first",
    )


def parse_architectures(args: argparse.Namespace, checks: bool) -> list[str]:
    """`--architectures`: distinct registered names ([] without the flag); a grid's axis only
    (the controller checks, `--select-from` and Optuna's studies run one architecture)."""
    if not getattr(args, "architectures", None):  # the controller checks have no such flag
        return []
    if checks or args.select_from or args.search == "optuna":
        raise UserError(
            "--architectures: crosses a grid (--search grid); for the controller checks, "
            "--select-from or --search optuna set one with --set model.architecture=NAME"
        )
    names = comma_list(args.architectures, "--architectures")
    if len(set(names)) != len(names):
        raise UserError(f"--architectures: expected distinct names, got '{args.architectures}'")
    return [known_architecture(name, "--architectures").name for name in names]


@dataclass(frozen=True)
class DataSource:
    """Flags of their own that say where a sweep's data are and what they mean, in place of
    --data-dir (the tabular benchmark's --data, --task, --spec, --preset: `relif_ray.cli.tabular`).

    add: adds the flags to the sweep's parser.
    read: (the parsed flags, the data set's defaults) -> the `SourceData`; it checks the data
        and writes nothing.
    """

    add: Callable[[argparse.ArgumentParser], None]
    read: Callable[[argparse.Namespace, DatasetDefaults], SourceData]


@dataclass(frozen=True)
class SourceData:
    """What a `DataSource`'s flags say: the data root, `data.spec`, whether the sweep writes
    the demo data there, and what writes the data it prepares there (a preset's table;
    `SweepRequest.prepare_data`)."""

    root: str
    spec: dict[str, Any]
    demo_data: bool = False
    prepare: Callable[[], object] | None = None


def parse_seeds(text: str) -> list[int]:
    """`7` -> seeds 0..6; `0,3,5` -> exactly those."""
    try:
        values = [int(part) for part in comma_list(text, "--seeds")]
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


def parse_range(text: str, flag: str, positive: bool = False) -> tuple[float, float]:
    values = parse_floats(text, flag)
    if len(values) != 2 or not values[0] < values[1] or (positive and values[0] <= 0):
        need = "0 < LOW < HIGH" if positive else "LOW < HIGH"
        raise UserError(f"{flag}: expected LOW,HIGH with {need}, got '{text}'")
    return values[0], values[1]


def parse_callbacks(text: str | None) -> tuple[str, ...]:
    """`--callbacks wandb,mlflow`: known names whose package is installed (Ray's integrations
    import them only when a trial starts); none without the flag."""
    if text is None:
        return ()
    names = tuple(dict.fromkeys(comma_list(text, "--callbacks")))
    for name in names:
        if name not in LOGGER_CALLBACKS:
            raise UserError(
                f"--callbacks: unknown logger '{name}' (known: {', '.join(LOGGER_CALLBACKS)})"
            )
        if importlib.util.find_spec(LOGGER_CALLBACKS[name]) is None:
            raise UserError(
                f"--callbacks {name}: the {LOGGER_CALLBACKS[name]} package is not installed "
                f"({install_hint(name)})"
            )
    return names
