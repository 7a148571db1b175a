"""A user's mistake ends its trial at once; only infrastructure failures are retried.

Ray Tune retries every failed trial up to `FailureConfig.max_failures` times: it counts the
failure (`Trial.handle_error`) and retries while `Trial.should_recover()`, i.e. while
`num_failures <= trial.max_failures`. `FailureConfig(fail_fast=True)` is no way out: it stops
the whole sweep on the first error of any kind. Tune has no per-exception rule, so a
`UserError` (a data file only a full load finds bad, a config the driver could not check)
would be retried like a lost node, and fail the same way each time.

The mechanism, in two public hooks and no patch of Tune:

1. `ending_on_user_error(trainable)` returns a subclass (as `tune.with_resources` does) whose
   `setup`/`step` catch a `UserError` and keep it; the next `step` reports one result
   `{"user_error": "<message>"}` (with NaN for the metrics the searcher reads) instead of
   training.
2. `UserErrorsEndTrials`, a Tune `Callback`, sees that result in `on_trial_result` (which the
   controller runs before it asks the trial for anything more) and sets that trial's
   `max_failures` to 0. The trial's next call (the following `step`, or the checkpoint Tune
   takes after the result) raises the kept `UserError`; Tune counts the failure, finds the
   trial may not recover, and marks it ERROR with the UserError's traceback in its
   `error.txt`, as any errored trial. `on_trial_start` gives every (re)started trial the
   sweep's `--max-failures` back, so a `--resume` after the fix retries as usual.

An actor or node death, or an out-of-memory kill, never passes through `step`'s handler, so it
keeps the `--max-failures` retries.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

from ray import tune

from relif_ray.errors import UserError

USER_ERROR = "user_error"
"""Result key of the one result a trial reports when a UserError ended it."""

TrainableType = TypeVar("TrainableType", bound=type[tune.Trainable])


def ending_on_user_error(trainable: TrainableType, metrics: tuple[str, ...] = ()) -> TrainableType:
    """`trainable`, with a `UserError` in `setup` or `step` reported once and then raised
    (see the module docstring). `metrics`: every metric a searcher or scheduler of the run
    reads; the one result carries them as NaN, since Tune stops the whole run on a result
    that lacks one."""

    class EndingOnUserError(trainable):  # type: ignore[misc, valid-type]
        def setup(self, config: dict[str, Any]) -> None:
            self.user_error: UserError | None = None
            self.user_error_reported = False
            try:
                super().setup(config)
            except UserError as error:
                self.user_error = error

        def step(self) -> dict[str, Any]:
            if self.user_error is None:
                try:
                    return super().step()
                except UserError as error:
                    self.user_error = error
            if not self.user_error_reported:
                self.user_error_reported = True
                return {USER_ERROR: str(self.user_error), **dict.fromkeys(metrics, math.nan)}
            raise self.user_error

        def save_checkpoint(self, checkpoint_dir: str) -> Any:
            if self.user_error is not None:
                raise self.user_error
            return super().save_checkpoint(checkpoint_dir)

    EndingOnUserError.__name__ = trainable.__name__  # Tune names the trials' trainable by it
    return EndingOnUserError  # type: ignore[return-value]


class UserErrorsEndTrials(tune.Callback):
    """Gives a trial that reported a user error no retries; every (re)started trial gets
    `max_failures` (the sweep's `--max-failures`)."""

    def __init__(self, max_failures: int) -> None:
        self.max_failures = max_failures

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        trial.max_failures = self.max_failures

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        if USER_ERROR in result:
            trial.max_failures = 0
