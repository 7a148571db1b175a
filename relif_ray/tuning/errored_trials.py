"""The errored trials of a finished Tune run, raised as `TrialsErrored` for the exit status."""

from __future__ import annotations

from ray import tune

from relif_ray.errors import last_line
from relif_ray.sweep.exit_status import ErroredTrial, TrialsErrored
from relif_ray.sweep.trial_config import TuneKeys


def errored_trials(results: tune.ResultGrid) -> list[ErroredTrial]:
    """Label, seed, last error line and error file of every trial that ended in ERROR."""
    errored = []
    for result in results:
        if result.error is None:
            continue
        keys = TuneKeys.of(result.config or {})
        errored.append(
            ErroredTrial(
                label="?" if keys.label is None else str(keys.label),
                seed=keys.seed,
                error=last_line(str(result.error)),
                error_file=f"{str(result.path).rstrip('/')}/error.txt",
            )
        )
    return errored


def raise_if_errored(results: tune.ResultGrid, experiment_dir: str) -> None:
    """`TrialsErrored` unless every trial terminated."""
    errored = errored_trials(results)
    if errored:
        raise TrialsErrored(experiment_dir, errored)
