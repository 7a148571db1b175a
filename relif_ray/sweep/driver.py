"""The sweep driver: run a planned sweep, or resume one, on Ray Tune (Ray is imported here
only when a sweep starts, through `relif_ray.tuning`).

`SweepRequest` is everything a sweep is, decided and checked before Ray starts (the command
line builds it: `relif_ray.cli.sweep`). `run` does what remains, in this order: the storage,
a lent `--reference` and the data set are checked; the experiment's lock is taken
(`relif_ray.experiment.lock`: one sweep per experiment directory, also for `--resume`); a new
sweep refuses to mix into an existing experiment (a demo replaces its own); the demo's data are
written; then `relif_ray.tuning.launch.run_sweep` runs (or resumes) the trials.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from relif_ray.experiment.lock import exclusive_experiment, prepare_new_experiment
from relif_ray.problems import DatasetDefaults, benchmark
from relif_ray.sweep.plan import OptunaPlan, Resources, SweepSpace, TuneOptions
from relif_ray.sweep.preflight import check_data, check_storage, lent_constants
from relif_ray.sweep.selection import Selection, record_selection

CHECKPOINT_INTERVAL_S = 10.0
"""--checkpoint-interval's default: at most one checkpoint per trial in 10 s, as Tune snapshots
the experiment state at most every 10 s on its own."""


@dataclass(frozen=True)
class SweepRequest:
    """One sweep, checked.

    space: the trials (None: `resume` continues the experiment as it was planned);
    search: the Optuna studies of `space` (None: a grid or an explicit trial list);
    data_root: the data set's folder; `demo`: a --demo sweep, whose data are written there
        when `writes_demo_data` and which replaces its own earlier experiment;
    reference: an experiment lending its same-seed ERM squash constants (`--reference`);
    selection: the (r*, eta) chosen per seed from a search (`--select-from`), recorded in the
        experiment as `selection.csv`;
    checkpoint_every: epochs between checkpoints (0: only the final one);
    checkpoint_interval_s: and at least this many seconds between two checkpoints of a trial
        (`relif_ray.tuning.launch.CheckpointCadence`).
    """

    defaults: DatasetDefaults
    name: str
    storage: str
    resources: Resources
    space: SweepSpace | None = None
    search: OptunaPlan | None = None
    options: TuneOptions | None = None
    data_root: str | None = None
    demo: bool = False
    writes_demo_data: bool = False
    reference: str | None = None
    selection: Selection | None = None
    max_failures: int = 2
    keep_checkpoints: int = 2
    checkpoint_every: int = 1
    checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S

    @property
    def resume(self) -> bool:
        return self.space is None


def run(request: SweepRequest) -> str:
    """Run (or resume) the sweep; return its experiment directory (a path or a URI). Raises
    `TrialsErrored` when trials errored (`relif_ray.sweep.outcome`)."""
    if not request.resources.address:
        from relif_ray.tuning import keep_local_ray_on_loopback

        keep_local_ray_on_loopback()
    from relif_ray.tuning import launch  # Ray is imported from here on

    if not request.resume:
        check_inputs(request)
    with exclusive_experiment(request.storage, request.name):
        if not request.resume:
            prepare_new_experiment(request.storage, request.name, replace=request.demo)
            if request.writes_demo_data:
                write_demo_data(request.data_root, request.defaults)
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
        print(f"fixed-delta audit threshold of the paper: delta_ref = {delta_ref:g}")
    return experiment_dir


def check_inputs(request: SweepRequest) -> None:
    """Before the lock: the storage, the lent squash constants and the data set (unless the
    demo writes it)."""
    check_storage(request.storage)
    if request.reference:
        lent_constants(request.reference)  # run_sweep copies them into the experiment
    if not request.writes_demo_data:
        check_data(request.defaults.dataset, request.data_root)


def write_demo_data(root: str, defaults: DatasetDefaults) -> None:
    """Write the synthetic demo data set once (atomically, so an existing folder is complete;
    later demo sweeps reuse it)."""
    if not Path(root).exists():
        benchmark(defaults.dataset).synthetic.write(Path(root), seed=0, **defaults.demo_data)
