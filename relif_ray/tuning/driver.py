"""The sweep driver: run a planned sweep, or resume one, on Ray Tune.

`SweepRequest` (`relif_ray.sweep.request`) is everything a sweep is, decided and checked before
Ray starts (the command line builds it: `relif_ray.cli.sweep`). `run` does what remains, in
this order: the storage, a lent `--reference` and the data set are checked (for `--resume`:
the storage and the experiment it continues); for a demo, Ray starts and the resources asked
are checked against it (other sweeps check them in `run_sweep`, before they write); the
experiment's lock is taken (`relif_ray.experiment.lock`: one sweep per experiment directory,
also for `--resume`); a new sweep refuses to mix into an existing experiment (a demo
replaces its own); the demo's data are written; then `relif_ray.tuning.launch.run_sweep` runs
(or resumes) the trials. Import this module through `relif_ray.tuning.run_sweep_request`,
which keeps a local Ray on 127.0.0.1 before Ray is imported.
"""

from __future__ import annotations

import logging
from pathlib import Path

from relif_ray.experiment.lock import exclusive_experiment, prepare_new_experiment
from relif_ray.problems import DatasetDefaults, benchmark, use_spec
from relif_ray.sweep.preflight import check_data, check_resumable, lent_constants
from relif_ray.sweep.request import SweepRequest
from relif_ray.sweep.selection import record_selection
from relif_ray.tuning import launch

LOGGER = logging.getLogger(__name__)


def run(request: SweepRequest) -> str:
    """Run (or resume) the sweep; return its experiment directory (a path or a URI). Raises
    `TrialsErrored` when trials errored, `SweepStopped` when a stop signal or its storage
    stopped it (`relif_ray.sweep.exit_status`)."""
    if request.resume:
        check_resumable(request.storage, request.name)
    else:
        check_inputs(request)
    if request.demo:  # a demo no trial could run fails before it replaces or writes anything
        launch.connect(request.resources)
        launch.check_cluster(request.resources)
    with exclusive_experiment(request.storage, request.name):
        if not request.resume:
            prepare_new_experiment(request.storage, request.name, replace=request.demo)
            if request.writes_demo_data:
                write_demo_data(request.data_root, request.defaults)
            if request.prepare_data is not None:
                request.prepare_data()
        experiment_dir = launch.run_sweep(
            request.space,
            name=request.name,
            storage=request.storage,
            resources=request.resources,
            max_failures=request.max_failures,
            keep_checkpoints=request.keep_checkpoints,
            checkpoint_every=request.checkpoint_every,
            checkpoint_interval_s=request.checkpoint_interval_s,
            resume=request.resume,
            search=request.search,
            options=request.options,
            reference=request.reference,
        )
    if request.selection is not None:
        record_selection(experiment_dir, request.selection)
    if request.defaults.delta_ref is not None and not request.resume:
        delta_ref = request.defaults.delta_ref
        LOGGER.info("fixed-delta audit threshold of the paper: delta_ref = %g", delta_ref)
    return experiment_dir


def check_inputs(request: SweepRequest) -> None:
    """Before the lock: the lent squash constants and the data set (unless the demo writes it);
    the command checked the storage when it made the request."""
    if request.reference:
        lent_constants(request.reference)  # run_sweep copies them into the experiment
    if request.space is not None:
        use_spec(request.space.base.data)
    if not request.writes_demo_data and request.prepare_data is None:
        check_data(request.defaults.dataset, request.data_root)


def write_demo_data(root: str, defaults: DatasetDefaults) -> None:
    """Write the synthetic demo data set once (atomically, so an existing folder is complete;
    later demo sweeps reuse it)."""
    if not Path(root).exists():
        benchmark(defaults.dataset).synthetic.write(Path(root), seed=0, **defaults.demo_data)
