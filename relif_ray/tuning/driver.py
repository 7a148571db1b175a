"""The sweep driver: check a sweep, then run it, or resume it, on Ray Tune.

`SweepRequest` (`relif_ray.sweep.request`) is everything a sweep is, decided before Ray starts
(the command line builds it: `relif_ray.cli.sweep`). `check` is every check of the request
before it launches, the one that every command that launches a sweep runs (through `run`);
`run` then does what remains, in this order: the experiment's lock is taken
(`relif_ray.experiment.lock`: one sweep per experiment directory, also for `--resume`); a new
sweep refuses to mix into an existing experiment (a demo replaces its own); the demo's data,
or the data the sweep prepares, are written; then `relif_ray.tuning.launch.run_sweep` runs (or
resumes) the trials, the request whole. Import this module through
`relif_ray.tuning.run_sweep_request`, which keeps a local Ray on 127.0.0.1 before Ray is
imported.
"""

from __future__ import annotations

import logging
from pathlib import Path

from relif_ray.experiment.lock import exclusive_experiment, prepare_new_experiment
from relif_ray.problems import DatasetDefaults, benchmark, use_spec
from relif_ray.sweep.preflight import (
    check_data,
    check_fused_sweep,
    check_resumable,
    check_storage,
    lent_constants,
)
from relif_ray.sweep.request import SweepRequest
from relif_ray.sweep.selection import record_selection
from relif_ray.tuning import launch
from relif_ray.tuning.cluster import check_cluster, connect

LOGGER = logging.getLogger(__name__)


def check(request: SweepRequest) -> None:
    """Every check of a sweep's request before it launches, found before anything is written
    and before Ray starts: the storage (`relif_ray.sweep.preflight.check_storage`); for
    `--resume`, the experiment it continues (`check_resumable`); else a lent `--reference`'s
    squash constants and the data set (unless the sweep writes it). The trial configs were
    checked when the request was planned (`relif_ray.sweep.plan.trial_space`); the cluster is
    checked where Ray is joined (`relif_ray.tuning.cluster`), after the experiment's lock, so
    that a sweep refused by the lock never starts Ray."""
    check_storage(request.storage)
    if request.resume:
        check_resumable(request.storage, request.name)
    else:
        if request.reference:
            lent_constants(request.reference)  # run_sweep copies them into the experiment
        if request.space is not None:
            use_spec(request.space.base.data)
            per_seed = request.search is not None or request.selection is not None
            scheduler = request.options.scheduler if request.options else "fifo"
            check_fused_sweep(request.space.base, scheduler, per_seed)
        if not request.writes_demo_data and request.prepare_data is None:
            check_data(request.space.base.data.dataset, request.data_root)


def run(request: SweepRequest) -> str:
    """Check (`check`) and run (or resume) the sweep; return its experiment directory (a path or
    a URI). Raises `TrialsErrored` when trials errored, `SweepStopped` when a stop signal or
    its storage stopped it (`relif_ray.sweep.exit_status`)."""
    check(request)
    with exclusive_experiment(request.storage, request.name):
        if request.demo:  # a demo no trial could run fails before it replaces anything
            connect(request.resources)
            check_cluster(request.resources)
        if not request.resume:
            prepare_new_experiment(request.storage, request.name, replace=request.demo)
            if request.writes_demo_data:
                write_demo_data(request.data_root, request.defaults)
            if request.prepare_data is not None:
                request.prepare_data()
        experiment_dir = launch.run_sweep(request)
    if request.selection is not None:
        record_selection(experiment_dir, request.selection)
    if request.defaults and request.defaults.delta_ref is not None and not request.resume:
        delta_ref = request.defaults.delta_ref
        LOGGER.info("fixed-delta audit threshold of the paper: delta_ref = %g", delta_ref)
    return experiment_dir


def write_demo_data(root: str, defaults: DatasetDefaults) -> None:
    """Write the synthetic demo data set once (atomically, so an existing folder is complete;
    later demo sweeps reuse it)."""
    if not Path(root).exists():
        benchmark(defaults.dataset).synthetic.write(Path(root), seed=0, **defaults.demo_data)
