"""The sweep front door: `relif sweep --dataset NAME ...` and the `sweeps/*.py` entry points.

`main` reads the flags (`relif_ray.cli.sweep_flags`; their defaults are the chosen data set's,
so --dataset is read first), checks them and builds the `SweepRequest`: the base config
(`relif_ray.sweep.compose`), the trials (`relif_ray.sweep.plan`: a grid, Optuna studies, the
(r*, eta) selected from a search, or the paper's controller checks) and how to run them. The
driver (`relif_ray.tuning.driver`) runs it. Everything is checked before Ray starts, every trial
config included; user mistakes exit with status 2 and one line `<program>: error: <what is
wrong>`; trials that errored exit 1 with their summary and the command that retries them; a
sweep that a signal stopped exits 75 with the command that resumes it
(`relif_ray.sweep.exit_status`).
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from relif_ray.audit import check_delta
from relif_ray.cli.parsing import OneLineParser, comma_list, parse_floats, run_command
from relif_ray.cli.sweep_flags import (
    CHECKS_SUFFIX,
    DataSource,
    SourceData,
    add_controller_checks_flag,
    build_parser,
    default_methods,
    parse_architectures,
    parse_callbacks,
    parse_range,
    parse_seeds,
)
from relif_ray.config import ExperimentConfig
from relif_ray.errors import UserError
from relif_ray.experiment.storage import display, local_path, parse
from relif_ray.methods import methods
from relif_ray.problems import DatasetDefaults, benchmarks, train_examples
from relif_ray.sweep.compose import compose_config, controller_budget, demo_budget
from relif_ray.sweep.exit_status import (
    EXIT_STOPPED,
    EXIT_TRIALS_ERRORED,
    SweepStopped,
    TrialsErrored,
    command_line,
    retry_command,
    stopped_line,
    summary_lines,
)
from relif_ray.sweep.labels import (
    RELIF_LABELS,
    grid_variants,
    split_label,
    uses_controller,
    with_architectures,
)
from relif_ray.sweep.overrides import parse_set, read_config_file
from relif_ray.sweep.plan import (
    GPUS_PER_TRIAL,
    OptunaPlan,
    Resources,
    SweepSpace,
    TuneOptions,
    controller_variants,
    param_space,
    plan_summary,
    selected_trials,
    trial_space,
)
from relif_ray.sweep.preflight import check_storage, resolve_pretrained, sweep_exists
from relif_ray.sweep.request import SweepRequest
from relif_ray.sweep.selection import Selection, read_pareto, select_settings
from relif_ray.tuning import run_sweep_request

DATASETS: dict[str, DatasetDefaults] = {name: b.defaults for name, b in benchmarks().items()}
"""Every registered benchmark's defaults (`relif_ray.problems`): the choices of --dataset."""
NYUV2, MIMIC3 = DATASETS["nyuv2"], DATASETS["mimic3"]
LOGGER = logging.getLogger(__name__)
CLINICAL = {name: DATASETS[name] for name in ("mimic3", "eicu")}
"""The data sets of `sweeps/clinical.py`."""

Planner = Callable[[ExperimentConfig], tuple[SweepSpace, OptunaPlan | None]]
"""The sweep's trials for its validated base config: (space, Optuna plan or None)."""


def main(
    argv: list[str] | None = None,
    *,
    prog: str | None = None,
    datasets: tuple[str, ...] | None = None,
    controller_checks: bool | None = None,
    retry: list[str] | None = None,
    source: DataSource | None = None,
) -> int:
    """Run a sweep from the command line; the exit status (`relif_ray.sweep.exit_status`).

    datasets: the choices of --dataset (default: every registered benchmark; with one, the
        flag is not offered: `sweeps/nyuv2.py`); controller_checks: True runs the paper's
        controller checks (`sweeps/controller_sensitivity.py`), None offers
        --controller-checks (`relif sweep`); retry: the program of the retry command;
        source: the data flags of a data set that --data-dir does not describe.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    name = prog or Path(sys.argv[0]).name
    program = retry or [sys.executable, sys.argv[0]]

    def command() -> int:
        try:
            experiment_dir = run(
                argv,
                prog=prog,
                datasets=datasets,
                controller_checks=controller_checks,
                source=source,
            )
        except TrialsErrored as failure:
            print(f"experiment directory: {display(failure.experiment_dir)}")
            print("\n".join(summary_lines(failure, retry_command(program, argv))), file=sys.stderr)
            return EXIT_TRIALS_ERRORED
        except SweepStopped as stop:
            from relif_ray.tuning.stop import ignore_stop_signals  # Ray: imported by now

            ignore_stop_signals()  # this process ends: let Ray's shutdown at exit finish
            print(f"experiment directory: {display(stop.experiment_dir)}")
            same = command_line(program, argv)
            print(stopped_line(stop, retry_command(program, argv), same), file=sys.stderr)
            return EXIT_STOPPED
        print(f"experiment directory: {display(experiment_dir)}")
        return 0

    return run_command(name, command)


def run(
    argv: list[str],
    *,
    prog: str | None = None,
    datasets: tuple[str, ...] | None = None,
    controller_checks: bool | None = None,
    source: DataSource | None = None,
) -> str:
    """Parse and check `argv`, then run the sweep (`relif_ray.tuning.run_sweep_request`); return its
    experiment directory. Arguments as for `main`. The one path of every sweep, the command
    line's and the Python API's (`relif_ray.sweep_api.run_sweep`), so it logs what it decided
    (the selection, the plan) and prints nothing: `main` shows the log as lines."""
    request = sweep_request(argv, prog, tuple(datasets or DATASETS), controller_checks, source)
    if request.selection is not None:
        LOGGER.info("\n".join(request.selection.lines()))
    if not request.resume:
        LOGGER.info(plan_summary(request.space, request.search, request.resources))
    return run_sweep_request(request)


def sweep_request(
    argv: list[str],
    prog: str | None,
    datasets: tuple[str, ...],
    controller_checks: bool | None,
    source: DataSource | None = None,
) -> SweepRequest:
    """Parse and check the flags of `argv` (--dataset first: its defaults are the flags')."""
    dataset, checks = choose(argv, datasets, offer_checks=controller_checks is None)
    defaults = DATASETS[dataset]
    checks = checks or bool(controller_checks)
    parser = build_parser(
        defaults, datasets, checks=checks, offer_checks=controller_checks is None, prog=prog
    )
    if source is not None:
        source.add(parser)
    args = parser.parse_args(argv)
    args.storage = parse(args.storage, "--storage")  # read once: checks and launch do I/O only
    if args.resume_if_present and not args.resume:
        args.resume = present(args, defaults, CHECKS_SUFFIX if checks else "")
    seeds = seeds_of(args, defaults)
    selection = None
    architectures = parse_architectures(args, checks)
    if checks:
        planner = checks_planner(args, defaults, seeds)
    elif args.select_from and not args.resume:
        planner, selection = selected_planner(args, defaults, seeds)
    else:
        planner = grid_planner(args, defaults, seeds, architectures)
    suffix = CHECKS_SUFFIX if checks else ""
    return request_of(args, defaults, suffix, planner, selection, source)


def present(args: argparse.Namespace, defaults: DatasetDefaults, suffix: str) -> bool:
    """`--resume-if-present`: whether the experiment holds a sweep to continue (then the sweep
    resumes it, as with `--resume`, and says so), else the flags start it."""
    name = experiment_name(args, defaults, suffix)
    check_storage(args.storage)  # before it is read (the driver's check runs again)
    if not sweep_exists(args.storage, name):
        return False
    LOGGER.info("--resume-if-present: continuing the sweep %s in %s", name, display(args.storage))
    return True


def choose(argv: list[str], datasets: tuple[str, ...], offer_checks: bool) -> tuple[str, bool]:
    """(--dataset, --controller-checks) of `argv`; they decide the other flags."""
    chooser = OneLineParser(add_help=False, allow_abbrev=False)  # --data is not --dataset
    default = "nyuv2" if "nyuv2" in datasets else datasets[0]
    chooser.add_argument("--dataset", choices=datasets, default=default)
    if offer_checks:
        add_controller_checks_flag(chooser, among_checks=False)
    known = chooser.parse_known_args(argv)[0]
    return known.dataset, getattr(known, "controller_checks", False)


def request_of(
    args: argparse.Namespace,
    defaults: DatasetDefaults,
    suffix: str,
    planner: Planner,
    selection: Selection | None,
    source: DataSource | None = None,
) -> SweepRequest:
    """The checked request (its storage is checked already, `sweep_request`): resources, name,
    then (unless resuming) the data, the base config and the trials."""
    limits = resources(args)
    check_delta(args.delta, "--delta")
    common: dict[str, Any] = {
        "defaults": defaults,
        "name": experiment_name(args, defaults, suffix),
        "storage": args.storage,
        "resources": limits,
        "max_failures": args.max_failures,
        "keep_checkpoints": args.keep_checkpoints,
        "checkpoint_interval_s": args.checkpoint_interval,
    }
    if args.resume:
        return SweepRequest(**common)
    if source is None:
        data = SourceData(data_root(args, defaults), {}, args.demo and not args.data_dir)
    else:
        data = source.read(args, defaults)
    root = data.root
    base = base_config(args, defaults, root, limits.gpus_per_trial > 0, data.spec)
    options = tune_options(args, base)
    space, search = planner(base)
    return SweepRequest(
        **common,
        space=space,
        search=search,
        options=options,
        data_root=root,
        demo=args.demo,
        writes_demo_data=data.demo_data,
        prepare_data=data.prepare,
        reference=args.reference,
        selection=selection,
        checkpoint_every=0 if args.demo else 1,
    )


def grid_planner(
    args: argparse.Namespace, defaults: DatasetDefaults, seeds: list[int], architectures: list[str]
) -> Planner:
    """Methods x seeds x (r*, eta) (x architectures), or with --search optuna the studies over
    (r*, eta)."""
    optuna = args.search == "optuna"
    default = "relif" if optuna else default_labels(args, defaults)
    labels = parse_labels(default if args.methods is None else args.methods)
    if optuna:
        plan = optuna_plan(args, labels, seeds)
        return lambda base: (plan.space(base, args.delta), plan)

    def planner(base: ExperimentConfig) -> tuple[SweepSpace, None]:
        variants = grid_variants(labels, *controller_grid(args, defaults, base))
        if architectures:
            variants = with_architectures(variants, architectures)
        return param_space(base, variants, seeds, args.delta), None

    return planner


def default_labels(args: argparse.Namespace, defaults: DatasetDefaults) -> str:
    """--methods when it is not given: the demo's, else the paper's methods."""
    return defaults.demo_train["methods"] if args.demo else default_methods()


def selected_planner(
    args: argparse.Namespace, defaults: DatasetDefaults, seeds: list[int]
) -> tuple[Planner, Selection]:
    """Each label and seed at the (r*, eta) selected from the search --select-from."""
    for flag, value in (("--r-star", args.r_star), ("--eta", args.eta)):
        if value is not None:
            raise UserError(
                f"--select-from: conflicts with {flag} (it selects r* and eta per seed)"
            )
    if args.search == "optuna":
        raise UserError(
            "--select-from: conflicts with --search optuna (it runs the selected setting)"
        )
    labels = parse_labels(default_labels(args, defaults) if args.methods is None else args.methods)
    chosen = select_settings(read_pareto(args.select_from), args.select_worst_tolerance)
    found = Selection(chosen, args.select_from, args.select_worst_tolerance)
    trials = selected_trials(labels, seeds, found.settings(), args.select_from)
    chosen = chosen[chosen["label"].isin(labels) & chosen["seed"].isin(seeds)]
    selection = Selection(chosen, args.select_from, args.select_worst_tolerance)
    return (lambda base: (trial_space(base, trials, args.delta), None)), selection


def checks_planner(
    args: argparse.Namespace, defaults: DatasetDefaults, seeds: list[int]
) -> Planner:
    """The paper's controller checks (`relif_ray.sweep.plan.controller_variants`)."""
    variants = controller_variants(
        args.eta_r_star,
        parse_floats(args.etas, "--etas"),
        parse_floats(args.r_stars, "--r-stars"),
        args.r_star_eta,
        parse_floats(args.static_lambdas, "--static-lambdas"),
        label=controller_label(args.label),
    )
    return lambda base: (param_space(base, variants, seeds, args.delta), None)


def base_config(
    args: argparse.Namespace,
    defaults: DatasetDefaults,
    root: str,
    use_gpu: bool | None = None,
    spec: dict[str, Any] | None = None,
) -> ExperimentConfig:
    """The ExperimentConfig shared by every trial of the sweep (validated;
    `relif_ray.sweep.compose.compose_config` of the flags' layers, with the controller's
    eta and warmup of `relif_ray.sweep.compose.controller_budget` for the trials' step budget,
    logged in one line); `use_gpu` defaults to what the resource flags ask for; `spec` is
    `data.spec`."""
    use_gpu = wants_gpus(args) if use_gpu is None else use_gpu
    layers = [
        (f"--config {args.config}", read_config_file(args.config) if args.config else {}),
        ("--set", parse_set(args.set)),
        ("flags", flag_fields(args)),
    ]
    demo = demo_budget(defaults, args.epochs, args.steps) if args.demo else None
    compose = functools.partial(
        compose_config, defaults, layers, root, use_gpu, demo, args.gpu_fast_path, spec or {}
    )
    config = compose()
    budget = controller_budget(defaults, config.train, lambda: train_examples(config.data))
    LOGGER.info(budget.line())
    config = compose(controller=budget)
    pretrained = resolve_pretrained(config.model.pretrained)
    return replace(config, model=replace(config.model, pretrained=pretrained))


def controller_grid(
    args: argparse.Namespace, defaults: DatasetDefaults, base: ExperimentConfig
) -> tuple[list[float], list[float]]:
    """(r* values, eta values) of the grid: the flags, else the data set's r* and the base
    config's eta (the controller-budget rule's, `base_config`)."""
    r_star = f"{defaults.r_star:g}" if args.r_star is None else args.r_star
    etas = [base.relif.eta] if args.eta is None else parse_floats(args.eta, "--eta")
    return parse_floats(r_star, "--r-star"), etas


def parse_labels(text: str, flag: str = "--methods") -> list[str]:
    """Method labels, each checked against the method registry (with the plug-ins of
    `RELIF_METHODS_PATH`) and the ReLiF labels."""
    labels = comma_list(text, flag)
    registered = methods()
    for label in labels:
        method, _ = split_label(label, flag)
        if method not in registered:
            raise UserError(
                f"{flag}: unknown method '{method}' (known: {', '.join(sorted(registered))}, "
                f"{', '.join(RELIF_LABELS)}; `relif methods` describes them)"
            )
    if len(set(labels)) != len(labels):
        raise UserError(f"{flag}: a label is repeated in '{text}'")
    return labels


def controller_label(text: str) -> str:
    """The one ReLiF label of the controller checks' `--label`; it must adapt lambda."""
    labels = parse_labels(text, "--label")
    if len(labels) != 1 or not uses_controller(labels[0]):
        raise UserError(
            f"--label: expected one ReLiF label that adapts lambda (e.g. relif, relif-st), "
            f"got '{text}'"
        )
    return labels[0]


def resources(args: argparse.Namespace) -> Resources:
    """The validated `Resources` of the flags (its rules: `Resources`; checked again against
    the cluster once Ray is up), after the other run flags."""
    if args.max_failures < 0 or args.keep_checkpoints < 1:
        raise UserError("--max-failures must be >= 0 and --keep-checkpoints >= 1")
    if not 0 <= args.checkpoint_interval < math.inf:
        raise UserError(
            f"--checkpoint-interval: must be >= 0 seconds, got {args.checkpoint_interval:g}"
        )
    gpus_per_trial = args.gpus_per_trial
    if gpus_per_trial is None:
        gpus_per_trial = min(GPUS_PER_TRIAL, args.num_gpus) if args.num_gpus > 0 else 0.0
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
    results = local_path(args.storage, "--storage")
    if results is None:
        raise UserError("--demo writes its data next to the results: use a local --storage")
    return str(results / "data" / f"{defaults.dataset}-demo")


def wants_gpus(args: argparse.Namespace) -> bool:
    return (args.gpus_per_trial or 0) > 0 or (args.gpus_per_trial is None and args.num_gpus > 0)


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
        "train.fused_seeds": args.fused_seeds,
        "relif.warmup_steps": args.warmup_steps,
    }
    fields = {field: value for field, value in given.items() if value is not None}
    if args.steps is not None and args.epochs is None:
        fields["train.epochs"] = None
    return fields


def experiment_name(args: argparse.Namespace, defaults: DatasetDefaults, suffix: str = "") -> str:
    default = f"{defaults.dataset}{suffix}{'-demo' if args.demo else ''}"
    name = default if args.name is None else args.name
    if "/" in name or name.startswith("."):
        raise UserError(f"--name: must be a plain folder name, got '{name}'")
    return name


def seeds_of(args: argparse.Namespace, defaults: DatasetDefaults) -> list[int]:
    default = defaults.demo_train["seeds"] if args.demo else defaults.seeds
    return parse_seeds(str(default) if args.seeds is None else args.seeds)


def tune_options(args: argparse.Namespace, base: ExperimentConfig | None) -> TuneOptions:
    """The scheduling and logging flags; ASHA's horizon is the trials' epochs."""
    if args.max_concurrent_trials is not None and args.max_concurrent_trials <= 0:
        raise UserError(f"--max-concurrent-trials: must be > 0, got {args.max_concurrent_trials}")
    return TuneOptions(
        scheduler=args.scheduler,
        scheduler_metric=args.scheduler_metric,
        asha_max_epochs=base.train.epochs if base else None,
        max_concurrent_trials=args.max_concurrent_trials,
        callbacks=parse_callbacks(args.callbacks),
    )


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
