"""A sweep driver that a cluster stops: SIGTERM (Slurm at a time limit or `scancel`, Kubernetes
at an eviction), SIGUSR1 (Slurm's early `--signal`) and SIGINT (Ctrl+C) are all Ray Tune's
graceful stop, and a second one is its hard stop.

Ray Tune 2.60 stops gracefully on SIGINT and SIGUSR1 only: it saves the experiment state once
more, stops the running trials (each keeps its last complete checkpoint) and returns from
`Tuner.fit` as if the run had ended. SIGTERM is not among them, and `ray.init` sets its own
SIGTERM handlers (Python's `sys.exit`, then Ray's C++ failure handler, which aborts the
process): a SIGTERM ended the driver at once, without the last state. A second SIGINT is
Tune's hard stop (Python's KeyboardInterrupt wherever the driver is), a second SIGUSR1 only
asks for the graceful stop again.

`StopSignals` makes the three signals alike. While the sweep is set up it owns them; a Tune
callback (`GracefulStop`, whose `setup` runs after Tune installed its own handlers) takes
Tune's SIGINT handler as the graceful stop and owns them again. Signal handlers belong to the
process, so the sweep's `StopSignals` is the process's (`stop_signals`): the callback holds no
state of its own, because Tune pickles a sweep's callbacks with the sweep and a resumed run
unpickles them. The first signal of any of the three is recorded and passed to Tune's graceful
stop; a second raises KeyboardInterrupt, Tune's hard stop, which still leaves the state Tune
saved last (every experiment checkpoint, at least every few seconds). Outside Tune's loop
(connecting, checking the cluster) the first signal stops at once: there is nothing to save
yet. The launch turns either end into `relif_ray.sweep.exit_status.SweepStopped`.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from ray import tune

LOGGER = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
"""The signals that stop a sweep gracefully (the first) or at once (a second)."""


class StopSignals:
    """The stop signals of one sweep: those that came (`received`, their names in order), and
    what the first does (`graceful`: Tune's own stop while its loop runs, else none: a hard
    stop)."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.graceful: Callable[[int, FrameType | None], Any] | None = None

    def own(self) -> None:
        """Handle the stop signals here (in the main thread only: Python allows no other)."""
        if threading.current_thread() is threading.main_thread():
            for number in STOP_SIGNALS:
                signal.signal(number, self.handle)

    def handle(self, number: int, frame: FrameType | None) -> None:
        """The handler of every stop signal: the first is the graceful stop where Tune's loop
        runs; any other stops at once (KeyboardInterrupt, raised where the driver is)."""
        self.received.append(signal.Signals(number).name)
        if len(self.received) == 1 and callable(self.graceful):
            LOGGER.warning(
                "%s: stopping the sweep gracefully (Ray Tune saves its state; running trials "
                "keep their last checkpoint); a second signal stops it at once",
                self.received[0],
            )
            self.graceful(signal.SIGINT, frame)
            self.own()  # Tune's stop put its previous SIGINT handler back
            return
        raise KeyboardInterrupt


_running: StopSignals | None = None
"""The stop signals of the sweep this process runs now (`stop_signals`)."""


@contextmanager
def stop_signals() -> Iterator[StopSignals]:
    """Own the stop signals while the block runs (a sweep's connect, checks and Tune run); the
    handlers before it are put back after it, however it ends (`ray.init`'s SIGTERM handler
    too), so a notebook or any other process that goes on after a sweep is interrupted as
    before. A command that ends after a stop ignores further ones itself
    (`ignore_stop_signals`)."""
    global _running
    main = threading.current_thread() is threading.main_thread()
    before = {number: signal.getsignal(number) for number in STOP_SIGNALS} if main else {}
    _running = stop = StopSignals()
    stop.own()
    try:
        yield stop
    finally:
        _running = None
        for number, handler in before.items():
            signal.signal(number, handler)


def ignore_stop_signals() -> None:
    """Ignore the stop signals from now on: for a command that ends after a stopped sweep,
    whose Ray shutdown at exit (seconds) a further signal would cut short, leaving Ray's
    processes behind."""
    if threading.current_thread() is threading.main_thread():
        for number in STOP_SIGNALS:
            signal.signal(number, signal.SIG_IGN)


class GracefulStop(tune.Callback):
    """Hands the stop signals back to the running sweep's `StopSignals` once Tune's run has set
    its own handlers, with Tune's SIGINT handler as the graceful stop (see the module
    docstring)."""

    def setup(self, **info: Any) -> None:
        stop = _running
        if stop is None or threading.current_thread() is not threading.main_thread():
            return
        tune_stop = signal.getsignal(signal.SIGINT)
        if tune_stop != stop.handle:
            stop.graceful = tune_stop
        stop.own()
