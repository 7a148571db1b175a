"""Ray Tune's own tools that a sweep switches on by flag: the ASHA scheduler and the W&B and
MLflow logger callbacks (`--scheduler`, `--callbacks`; `relif_ray.sweep.plan.TuneOptions`).

ASHA (`ray.tune.schedulers.AsyncHyperBandScheduler`) ranks trials at each rung by one metric of
the epoch's result and stops the worse ones. The same-seed ERM trials are the reference that
ReLiF trains on and the audit squashes NYUv2 scores with, so they must run their whole budget:
`ReferenceSafeASHA` leaves them out of the rungs altogether (never stopped, never ranked
against). A trial can only be stopped at a rung, so a trial writes its outputs (status
"stopped") at the checkpoints of the rung epochs (`asha_rung_epochs`, which the sweep hands
every trial: `relif_ray.sweep.trial_config.TuneKeys`); a trial that goes on overwrites them at
the end.
"""

from __future__ import annotations

import math
import os
from typing import Any

from ray.tune import Callback
from ray.tune.experiment import Trial
from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler

from relif_ray.experiment.record import SCHEDULER_METRICS, was_evaluated
from relif_ray.reference import is_reference
from relif_ray.sweep.plan import TuneOptions
from relif_ray.sweep.trial_config import experiment_config

ASHA_OPEN_ENDED_EPOCHS = 10_000
"""ASHA's max_t when the budget is steps only (the epochs are not known before data loads)."""


def is_reference_trial(trial: Trial) -> bool:
    """Whether a trial (by its flat Tune config) is an ERM reference trial
    (`relif_ray.reference.is_reference`)."""
    return is_reference(experiment_config(trial.config))


class ReferenceSafeASHA(AsyncHyperBandScheduler):
    """ASHA over every trial except the ERM reference trials, which it never ranks or stops,
    on validated epochs only (a trial validates at every rung: `trainable.evaluates_after`;
    an epoch without validation, `evaluated: false`, is never ranked)."""

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        if not is_reference_trial(trial):
            super().on_trial_add(tune_controller, trial)

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        if is_reference_trial(trial) or not was_evaluated(result):
            return TrialScheduler.CONTINUE
        return super().on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict) -> None:
        if not is_reference_trial(trial):
            super().on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller: Any, trial: Trial) -> None:
        if not is_reference_trial(trial):
            super().on_trial_remove(tune_controller, trial)


def asha_rung_epochs(options: TuneOptions) -> list[int]:
    """The epochs at which ASHA may stop a trial: grace * rf^k below max_t, and max_t (Ray's
    rungs of one bracket)."""
    max_t = options.asha_max_epochs or ASHA_OPEN_ENDED_EPOCHS
    grace, factor = options.asha_grace_epochs, options.asha_reduction_factor
    count = int(math.log(max_t / grace) / math.log(factor) + 1)
    return sorted({*(int(grace * factor**k) for k in range(count)), max_t})


def scheduler(options: TuneOptions) -> TrialScheduler | None:
    """The trial scheduler of `options` (None: Tune's FIFO)."""
    if options.scheduler != "asha":
        return None
    return ReferenceSafeASHA(
        metric=options.scheduler_metric,
        mode=SCHEDULER_METRICS[options.scheduler_metric],
        max_t=options.asha_max_epochs or ASHA_OPEN_ENDED_EPOCHS,
        grace_period=options.asha_grace_epochs,
        reduction_factor=options.asha_reduction_factor,
    )


def logger_callbacks(names: tuple[str, ...], experiment: str) -> list[Callback]:
    """Ray's W&B and MLflow logger callbacks: one run per trial, named like the trial, with its
    resolved config as parameters and every epoch's result as metrics. W&B reads its settings
    from the driver's environment (WANDB_PROJECT, default the experiment name; WANDB_MODE, e.g.
    offline; WANDB_DIR; WANDB_API_KEY or `wandb login`); MLflow logs to MLFLOW_TRACKING_URI
    (default ./mlruns) in an MLflow experiment named like the sweep."""
    callbacks: list[Callback] = []
    if "wandb" in names:
        # The logging actors run in Ray workers, which do not see the driver's WANDB_MODE or
        # WANDB_DIR: hand them to wandb.init.
        settings = {"mode": os.environ.get("WANDB_MODE"), "dir": os.environ.get("WANDB_DIR")}
        project = os.environ.get("WANDB_PROJECT", experiment)
        callbacks.append(
            wandb_callback(
                project=project,
                group=experiment,
                **{key: value for key, value in settings.items() if value},
            )
        )
    if "mlflow" in names:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        callbacks.append(MLflowLoggerCallback(experiment_name=experiment))
    return callbacks


def wandb_callback(**wandb_init: Any) -> Callback:
    """Ray's `WandbLoggerCallback`, whose logging actors wait for W&B to write out their run.

    Ray kills a trial's logging actor as soon as its `wandb.finish()` returns, which is before
    W&B's own service process (a child of the actor, which exits with it) has written the run
    out: the last trial of a sweep, cleaned up at once at the experiment's end, was left with an
    empty run file in offline mode (seen in our W&B test). `wandb.teardown()` waits for that
    process to finish, as W&B's exit hook would where the process ends normally.

    Ray hands the driver's WANDB_API_KEY to its logging actors in their `runtime_env`, and Ray's
    runtime-env agent writes every runtime_env, variables and all, to its log in the session
    folder. The actors here get none: they run on the driver's node (Ray places them there),
    in a worker of that node's Ray, which a local Ray started by the sweep inherits with the
    driver's environment; on a cluster, that node's own key (its environment, `wandb login`).
    """
    import ray
    from ray.air.integrations.wandb import WandbLoggerCallback, _WandbLoggingActor
    from ray.air.util.node import _force_on_current_node

    class WrittenOutLoggingActor(_WandbLoggingActor):
        def run(self) -> None:
            super().run()
            self._wandb.teardown()

    class WrittenOutWandbLoggerCallback(WandbLoggerCallback):
        _logger_actor_cls = WrittenOutLoggingActor

        def _start_logging_actor(self, trial: Any, exclude_results: list[str], **init: Any):
            if not self._remote_logger_class:  # Ray's options, less the runtime_env
                self._remote_logger_class = ray.remote(
                    num_cpus=0, **_force_on_current_node(), max_restarts=-1, max_task_retries=-1
                )(self._logger_actor_cls)
            super()._start_logging_actor(trial, exclude_results, **init)

    return WrittenOutWandbLoggerCallback(**wandb_init)
