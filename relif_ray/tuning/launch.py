"""Launch a checked sweep on Ray Tune (`run_sweep` takes its `SweepRequest` whole): join Ray
and check the cluster, run or resume the sweep with its checkpoint cadence, and write the
Optuna studies' Pareto sets.

`relif_ray.tuning` is the only package of the library that imports Ray; what a sweep runs is
planned without Ray in `relif_ray.sweep.plan`, and checked before it launches by
`relif_ray.tuning.driver.check`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pandas as pd
import ray
from ray import tune
from ray.tune.result import SHOULD_CHECKPOINT, TRAINING_ITERATION

from relif_ray.errors import UserError, first_line
from relif_ray.experiment.layout import PARETO_FILE
from relif_ray.experiment.record import (
    CHECKPOINT_SECONDS,
    OBJECTIVES,
    PARETO_METRICS,
    PROGRESS_METRICS,
    PROGRESS_PARAMETERS,
    VAL_BIAS,
    VAL_WORST,
)
from relif_ray.experiment.storage import (
    Location,
    join,
    location,
    resolved,
    write_text,
)
from relif_ray.reference import write_squash_constants
from relif_ray.sweep.exit_status import SweepStopped, by_signals, by_storage
from relif_ray.sweep.labels import trial_name
from relif_ray.sweep.plan import (
    OptunaPlan,
    Resources,
    SweepSpace,
    TrialOrder,
    TuneOptions,
    trial_order,
)
from relif_ray.sweep.preflight import lent_constants
from relif_ray.sweep.request import SweepRequest
from relif_ray.sweep.selection import STUDY, pareto_front
from relif_ray.sweep.trial_config import TuneKeys, tune_constants
from relif_ray.tuning.cluster import check_cluster, check_storage_visible, connect
from relif_ray.tuning.errored_trials import raise_if_errored
from relif_ray.tuning.integrations import (
    asha_rung_epochs,
    logger_callbacks,
    scheduler,
)
from relif_ray.tuning.order import ReferenceOrder
from relif_ray.tuning.resume import repair_driver_state
from relif_ray.tuning.search import StudyGroups
from relif_ray.tuning.stop import GracefulStop, StopSignals, stop_signals
from relif_ray.tuning.trainable import ReLiFTrainable
from relif_ray.tuning.tune_storage import keep_credentials_out_of_runtime_env, tune_storage
from relif_ray.tuning.user_errors import UserErrorsEndTrials, ending_on_user_error

LOGGER = logging.getLogger(__name__)


def write_pareto(experiment_dir: Location, results: tune.ResultGrid) -> str | None:
    """`<experiment>/pareto.csv`: the Pareto set of every Optuna study of the sweep, in the
    columns `relif_ray.sweep.selection.PARETO_COLUMNS` (after the study, each a value its
    trials report: `PARETO_METRICS`)."""
    rows = []
    for result in results:
        study = TuneKeys.of(result.config or {}).study
        metrics = result.metrics or {}
        if study is None or result.error is not None or VAL_BIAS not in metrics:
            continue
        rows.append({STUDY: study, **{key: metrics[key] for key in PARETO_METRICS}})
    if not rows:
        return None
    table = pd.DataFrame(rows).dropna(subset=[VAL_BIAS, VAL_WORST])
    path = join(location(experiment_dir), PARETO_FILE)
    write_text(path, pareto_front(table).to_csv(index=False))
    return str(path)


CHECKPOINT_SHARE = 0.05
"""The most of a trial's time its checkpoints may take: a checkpoint that took c seconds
(written and persisted, `relif_ray.experiment.record.CHECKPOINT_SECONDS`) is followed by the
next no sooner than c / CHECKPOINT_SHARE seconds later."""


class CheckpointCadence(tune.Callback):
    """Which epochs end with a checkpoint (Tune's own `checkpoint_frequency` is 0): every
    `every` epochs (0: none), but no sooner than `min_interval_s` after the trial's previous
    checkpoint or (re)start, and no sooner than its last checkpoint's seconds divided by
    `CHECKPOINT_SHARE`; always at the epochs in `always` (the ASHA rungs, where a trial writes
    its outputs); the final checkpoint is Tune's `checkpoint_at_end`.

    Why a floor in seconds: with `--keep-checkpoints N`, every N-th checkpoint of a trial makes
    Tune snapshot the experiment state at once (so the state never names a deleted
    checkpoint), so epochs of a second (short synthetic data) with a checkpoint each would
    snapshot several times a second and write a checkpoint per second. Why one that follows the
    checkpoint's own cost: the trial waits while Tune saves and persists it, so a ResNet-50
    with Adam's moments (hundreds of MB) written after every few-second GPU epoch would cost
    the trial a large share of its time; so it pays at most `CHECKPOINT_SHARE` of it. Resume
    is exact from any checkpoint, so a later one loses at most that interval plus an epoch of
    work.
    """

    def __init__(self, every: int, min_interval_s: float, always: Iterable[int] = ()) -> None:
        self.every = every
        self.min_interval_s = min_interval_s
        self.always = set(always)
        self._last: dict[str, tuple[int, float]] = {}

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._last[trial.trial_id] = (self._epoch(trial.last_result), time.monotonic())

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        epoch, now = self._epoch(result), time.monotonic()
        last_epoch, last_time = self._last.get(trial.trial_id, (0, now - self.min_interval_s))
        due = self.every > 0 and epoch - last_epoch >= self.every
        if epoch in self.always or (due and now - last_time >= self.interval_s(result)):
            result[SHOULD_CHECKPOINT] = True
            self._last[trial.trial_id] = (epoch, now)

    def interval_s(self, result: dict) -> float:
        """The least seconds between two checkpoints of the trial that reported `result`."""
        cost = float(result.get(CHECKPOINT_SECONDS, math.nan))
        return max(self.min_interval_s, cost / CHECKPOINT_SHARE if math.isfinite(cost) else 0.0)

    @staticmethod
    def _epoch(result: dict | None) -> int:
        return int((result or {}).get(TRAINING_ITERATION, 0))


def _trial_name(trial: Any) -> str:
    """The trial's name in the progress table, W&B and MLflow: label, setting, seed
    (`relif_ray.sweep.labels.trial_name`)."""
    return trial_name(trial.config)


def _trial_dirname(trial: Any) -> str:
    return f"{trial_name(trial.config)}_{trial.trial_id}"


def concurrency(resources: Resources, options: TuneOptions, trials: int | None) -> int:
    """How many trials Tune keeps live (running or pending) at once: at most
    `--max-concurrent-trials`, and no more than the GPUs hold; otherwise every trial of a grid
    (`trials`), and for Optuna (`trials` None) the trials the cluster's CPUs can run.

    Tune lets a custom searcher (`ReferenceOrder`) keep only ONE trial pending unless it is
    limited (`max_concurrent_trials` wraps it in a `ConcurrencyLimiter`): with one pending
    trial a free slot waits, and a finished trial's actor is often torn down before the next
    trial is created, so that trial starts a fresh process. Limited to the grid's size, every
    trial that waits for nothing is pending from the start, as with Tune's grid search, and
    actors are reused; Optuna's studies draw no further ahead of their results than the free
    slots.
    """
    limits = [n for n in (resources.max_concurrent_trials, options.max_concurrent_trials) if n]
    if limits:
        return min(limits)
    if trials is not None:
        return max(1, trials)
    cpus = ray.cluster_resources().get("CPU", 1.0)
    return max(1, math.floor(cpus / max(resources.cpus_per_trial, 1e-9) + 1e-9))


def reference_order(
    space: SweepSpace, search: OptunaPlan | None, experiment_dir: Location, reference: str | None
) -> TrialOrder:
    """The sweep's `TrialOrder`; with `reference`, that experiment's squash constants are copied
    into this one first, and its seeds wait for nothing. Logs the ERM trials it adds."""
    ready: dict[str, dict[str, list[float]]] = {}
    if reference:
        ready = lent_constants(reference)
        write_squash_constants(experiment_dir, ready)
    order = trial_order(space, search, set(ready))
    if order.added_references:
        seeds = ", ".join(order.added_references)
        LOGGER.info(
            "added ERM reference trials for seed(s) %s: ReLiF trains on the squash constants "
            "of the same-seed ERM validation run (paper appendix A.3)",
            seeds,
        )
    return order


@contextmanager
def stopping(stop: StopSignals, experiment_dir: str) -> Iterator[None]:
    """The sweep in the block ends as `SweepStopped` on a hard stop (a stop signal outside
    Tune's loop, or a second one during its graceful stop: `relif_ray.tuning.stop`), and where
    Ray Tune, or the driver's own records, could not reach the storage: Tune tolerates a failed
    upload of its state (it logs it and tries again at its next snapshot), but a listing or
    download that fails, such as the one that ends its run, escapes `Tuner.fit` as an OSError
    (Ray's own ConnectionError, an OSError too, is not the storage's and stands). Trials go on
    failing and being retried on their own (`--max-failures`)."""
    try:
        yield
    except KeyboardInterrupt:
        signals = stop.received or ["SIGINT"]
        raise stopped(experiment_dir, by_signals(signals, at_once=True)) from None
    except ConnectionError:
        raise
    except OSError as error:
        raise stopped(experiment_dir, by_storage(first_line(error))) from error


def stopped(experiment_dir: str, cause: str) -> SweepStopped:
    """A sweep that stopped for `cause`, and whether Tune had saved a sweep there that
    `--resume` continues (taken to be so where the storage cannot be read: it had been
    written before)."""
    try:
        resumable = tune.Tuner.can_restore(*tune_storage(experiment_dir))
    except OSError:
        resumable = True
    return SweepStopped(experiment_dir, cause, resumable=resumable)


def run_sweep(
    request: SweepRequest,
    *,
    callbacks: list[tune.Callback] | None = None,
    verbose: int = 1,
    trainable: type[ReLiFTrainable] = ReLiFTrainable,
) -> str:
    """Run (or resume) the sweep of a checked `request` (`relif_ray.tuning.driver.check`, which
    the driver runs first); return the experiment directory (a path or a URI).

    Checks that fail fast once Ray is joined (`connect`), before any trial starts: resources
    (`check_cluster`) and, on a multi-node cluster, shared storage (`check_storage_visible`);
    a demo's were made before it replaced its experiment. A resumed sweep continues a killed
    one from its experiment state: finished trials are kept, unfinished and errored ones
    continue from their last checkpoint. `trainable` may be an instrumented subclass: it stays
    for the benchmarks' sweep and breakdown suites, which time a trial's set-up, steps and saves
    inside its actor, where nothing else sees them; a `UserError` in a trial ends it without
    retries (`relif_ray.tuning.user_errors`), and trials that end in ERROR raise
    `TrialsErrored` after the run (experiment state, outputs and `pareto.csv` are written).
    SIGTERM, SIGUSR1 and SIGINT stop the sweep gracefully (a second one at once) and raise
    `SweepStopped` (`relif_ray.tuning.stop`), as does storage that Tune cannot reach
    (`stopping`).
    `request.checkpoint_every`: epochs between checkpoints, 0 = only the final one;
    `request.checkpoint_interval_s`: and at least this many seconds between two checkpoints of
    a trial (`CheckpointCadence`: short epochs would otherwise make Tune snapshot the
    experiment state several times a second). Tune's warning about frequent snapshots is
    switched off (it says to checkpoint less often, which the cadence does; trials of a sweep
    still checkpoint at independent moments).

    Trials reach Tune through `ReferenceOrder`: a ReLiF trial that trains on its seed's ERM
    squash constants starts after that seed's ERM trial (added where the sweep has none, and
    said so); `request.reference` (an experiment directory or URI) lends its
    `squash_constants.json` instead, for the seeds it has.
    """
    name, storage, resume = request.name, request.storage, request.resume
    resources, options = request.resources, request.options or TuneOptions()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # Tune's CLIReporter shows our progress columns
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    experiment = join(resolved(storage), name)  # the storage was read once, in the request
    experiment_dir = str(experiment)
    with stop_signals() as stop, stopping(stop, experiment_dir):
        storage_path = str(resolved(storage))
        connect(resources)
        keep_credentials_out_of_runtime_env()
        check_cluster(resources)
        check_storage_visible(storage_path)
        with_resources = tune.with_resources(
            ending_on_user_error(trainable, metrics=tuple(OBJECTIVES)),
            {"cpu": resources.cpus_per_trial, "gpu": resources.gpus_per_trial},
        )
        experiment_path, store = tune_storage(experiment)
        exists = tune.Tuner.can_restore(experiment_path, store)
        if resume and not exists:
            raise UserError(f"--resume: no sweep to resume at {experiment_dir}")
        if not resume and exists:
            raise UserError(
                f"--name: a sweep already exists at {experiment_dir} (use --resume to continue it, "
                "or another --name)"
            )
        rungs = asha_rung_epochs(options) if options.scheduler == "asha" else []
        cadence = CheckpointCadence(request.checkpoint_every, request.checkpoint_interval_s, rungs)
        callbacks = [
            *(callbacks or []),
            *logger_callbacks(options.callbacks, name),
            cadence,
            GracefulStop(),
        ]
        if resume:
            for file_name in repair_driver_state(experiment):
                LOGGER.info(
                    "--resume: %s was cut off by the killed driver; put back its full copy",
                    file_name,
                )
            tuner = tune.Tuner.restore(
                experiment_path, with_resources, resume_errored=True, storage_filesystem=store
            )
        else:
            space, search = request.space, request.search
            assert space is not None, "a new sweep needs its space"
            order = reference_order(space, search, experiment, request.reference)
            shared = replace(
                space.shared, outputs_at_iterations=tuple(rungs), experiment_dir=experiment_dir
            )
            constants = tune_constants(space.base, space.delta, shared)
            tuner = tune.Tuner(
                with_resources,
                param_space=constants,
                tune_config=tune.TuneConfig(
                    reuse_actors=True,
                    search_alg=ReferenceOrder(
                        order.tune_items(),
                        experiment_dir,
                        StudyGroups(search) if search else None,
                        order.studies_need_reference,
                        order.study_keys,
                    ),
                    scheduler=scheduler(options),
                    num_samples=len(order.items) + (search.total_trials if search else 0),
                    max_concurrent_trials=concurrency(
                        resources, options, None if search else len(order.items)
                    ),
                    trial_name_creator=_trial_name,
                    trial_dirname_creator=_trial_dirname,
                ),
                run_config=tune.RunConfig(
                    name=name,
                    storage_path=tune_storage(resolved(storage))[0],
                    storage_filesystem=store,
                    checkpoint_config=tune.CheckpointConfig(
                        checkpoint_frequency=0,  # CheckpointCadence asks for them
                        checkpoint_at_end=True,
                        num_to_keep=request.keep_checkpoints,
                    ),
                    failure_config=tune.FailureConfig(max_failures=request.max_failures),
                    progress_reporter=tune.CLIReporter(
                        metric_columns=PROGRESS_METRICS,
                        parameter_columns=PROGRESS_PARAMETERS,
                        max_report_frequency=30,
                    ),
                    callbacks=[*callbacks, UserErrorsEndTrials(request.max_failures)],
                    verbose=verbose,
                ),
            )
        results = tuner.fit()
        if stop.received:  # Tune stopped gracefully
            raise stopped(experiment_dir, by_signals(stop.received, at_once=False))
        write_pareto(experiment, results)
    raise_if_errored(results, experiment_dir)
    return experiment_dir
