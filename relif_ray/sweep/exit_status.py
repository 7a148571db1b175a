"""How a finished sweep went, for its exit status (no Ray import).

A sweep exits 0 only if every trial terminated. Otherwise the Ray layer raises
`TrialsErrored` after the run, and the sweep script ends with one line per errored trial and
the command that retries them (`--resume` with the same flags), with exit status 1.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

EXIT_TRIALS_ERRORED = 1
"""Exit status of a sweep that ran but left errored trials (2 is a mistake found before)."""


@dataclass(frozen=True)
class ErroredTrial:
    """label, seed: what the trial trained; error: the last line of its error; error_file: the
    `error.txt` Tune wrote in the trial's folder (the full traceback of each failure)."""

    label: str
    seed: int | None
    error: str
    error_file: str


class TrialsErrored(Exception):
    """The sweep ran to its end, but these trials errored."""

    def __init__(self, experiment_dir: str, trials: list[ErroredTrial]) -> None:
        super().__init__(f"{len(trials)} trial(s) errored in {experiment_dir}")
        self.experiment_dir = experiment_dir
        self.trials = trials


def retry_command(program: list[str], argv: list[str]) -> str:
    """The command line that resumes the sweep: the same flags plus `--resume`."""
    flags = argv if "--resume" in argv else [*argv, "--resume"]
    return shlex.join([*program, *flags])


def summary_lines(failure: TrialsErrored, retry: str) -> list[str]:
    """The closing lines of a sweep with errored trials: one per trial, then how to retry."""
    lines = [f"{len(failure.trials)} trial(s) errored in {failure.experiment_dir}:"]
    for trial in failure.trials:
        lines.append(
            f"  {trial.label} seed {trial.seed}: {trial.error} (error file: {trial.error_file})"
        )
    lines.append(f"retry the errored trials (after fixing the cause) with: {retry}")
    return lines
