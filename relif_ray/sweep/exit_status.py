"""How a sweep ended, for its exit status (no Ray import).

A sweep exits 0 only if every trial terminated. Otherwise the Ray layer raises one of two
exceptions after the run, and the sweep script ends with what to do next:

- `TrialsErrored`: the sweep ran to its end but trials errored; one line per errored trial
  and the command that retries them (`--resume` with the same flags), exit status 1;
- `SweepStopped`: the sweep stopped early and can be resumed: a stop signal (a cluster's
  SIGTERM or SIGUSR1 at a time limit, preemption or eviction; Ctrl+C), or Ray Tune could not
  reach its storage (an object store that is down); one line with the command that continues
  it, exit status `EXIT_STOPPED`, which a job script can tell from a failure and requeue on.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from relif_ray.experiment.storage import display, redacted

EXIT_TRIALS_ERRORED = 1
"""Exit status of a sweep that ran but left errored trials (2 is a mistake found before)."""
EXIT_STOPPED = 75
"""Exit status of a sweep that stopped before its trials finished and can be resumed:
sysexits.h's EX_TEMPFAIL ("a temporary failure; the user is invited to retry"), neither 0 nor
the statuses of errors (1, 2), nor the 128 + N of a process that a signal killed."""
RESUME_FLAGS = ("--resume", "--resume-if-present")
"""The flags with which the same command continues an existing sweep."""


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


class SweepStopped(Exception):
    """The sweep stopped before its trials finished; `cause` says why, as the words after
    "sweep stopped " (`by_signals`, `by_storage`); resumable: the experiment holds a sweep that
    `--resume` continues (False when Ray Tune had not saved one yet)."""

    def __init__(self, experiment_dir: str, cause: str, *, resumable: bool) -> None:
        super().__init__(f"sweep in {experiment_dir} stopped {cause}")
        self.experiment_dir = experiment_dir
        self.cause = cause
        self.resumable = resumable


def by_signals(signals: list[str], at_once: bool) -> str:
    """Why a sweep stopped, for stop signals (`signals`, their names in the order they came):
    Ray Tune's graceful stop, or (`at_once`) its hard stop: a second signal during the graceful
    one, or a first one before Tune's run began."""
    names = ", then ".join(signals)
    if not at_once:
        kept = "Ray Tune saved its state, and each running trial keeps its last checkpoint"
        return f"by {names}: {kept}"
    if len(signals) > 1:
        return f"at once by a second signal ({names}): the state Ray Tune saved last is kept"
    return f"at once by {names}"


def by_storage(error: str) -> str:
    """Why a sweep stopped, when Ray Tune could not reach its storage (`error`: what failed)."""
    return f"because its storage failed ({error}): the state Ray Tune saved there last is kept"


def command_line(program: list[str], argv: list[str]) -> str:
    """The command as given, as shown to the user: without the credentials of a URI in it
    (`redacted`), which the command takes again from the environment, or from the URI given
    again."""
    return shlex.join(redacted(word) for word in [*program, *argv])


def retry_command(program: list[str], argv: list[str]) -> str:
    """The command line that resumes the sweep (`command_line`): the same flags, plus
    `--resume` unless they already resume (`RESUME_FLAGS`)."""
    resumes = any(flag in argv for flag in RESUME_FLAGS)
    return command_line(program, argv if resumes else [*argv, "--resume"])


def summary_lines(failure: TrialsErrored, retry: str) -> list[str]:
    """The closing lines of a sweep with errored trials: one per trial, then how to retry."""
    lines = [f"{len(failure.trials)} trial(s) errored in {display(failure.experiment_dir)}:"]
    for trial in failure.trials:
        lines.append(
            f"  {trial.label} seed {trial.seed}: {trial.error} (error file: {trial.error_file})"
        )
    lines.append(f"retry the errored trials (after fixing the cause) with: {retry}")
    return lines


def stopped_line(stop: SweepStopped, resume: str, same: str) -> str:
    """The one closing line of a stopped sweep: why it stopped and the command that continues
    it (`resume`; `same`, the command as given, where there is nothing to resume yet)."""
    if not stop.resumable:
        unsaved = "Ray Tune had not saved it yet"
        return f"sweep stopped {stop.cause}; {unsaved}: start it again with: {same}"
    return f"sweep stopped {stop.cause}; resume with: {resume}"
