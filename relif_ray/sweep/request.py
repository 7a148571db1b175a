"""A sweep as the command line decided it (no Ray import): `relif_ray.tuning.driver` checks it
(`check`) and runs it; `relif_ray.tuning.launch.run_sweep` launches it on Ray Tune, whole."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from relif_ray.experiment.storage import StorageLocation, parse
from relif_ray.problems import DatasetDefaults
from relif_ray.sweep.plan import OptunaPlan, Resources, SweepSpace, TuneOptions
from relif_ray.sweep.selection import Selection

CHECKPOINT_INTERVAL_S = 10.0
"""--checkpoint-interval's default: at most one checkpoint per trial in 10 s, as Tune snapshots
the experiment state at most every 10 s on its own."""


@dataclass(frozen=True)
class SweepRequest:
    """One sweep.

    name, storage: the experiment `<storage>/<name>`, the storage read once where the request
        is made (`relif_ray.experiment.storage.parse`; a path or URI given in code is read
        here), so that the checks and the launch enter storage for I/O only; resources: what
        it may use;
    space: the trials (None: `resume` continues the experiment as it was planned);
    search: the Optuna studies of `space` (None: a grid or an explicit trial list);
    options: how Tune schedules and logs the trials (None: `TuneOptions()`);
    defaults: the data set's defaults (None in a request built in code, which
        `relif_ray.tuning.launch.run_sweep` launches without the driver);
    data_root: the data set's folder; `demo`: a --demo sweep, whose data are written there
        when `writes_demo_data` and which replaces its own earlier experiment;
    reference: an experiment lending its same-seed ERM squash constants (`--reference`);
    selection: the (r*, eta) chosen per seed from a search (`--select-from`), recorded in the
        experiment as `selection.csv`;
    prepare_data: writes the data the sweep prepares from others (a preset's table, at
        `data_root`), once every check has passed, inside the experiment's lock; None: none;
    checkpoint_every: epochs between checkpoints (0: only the final one);
    checkpoint_interval_s: and at least this many seconds between two checkpoints of a trial
        (`relif_ray.tuning.launch.CheckpointCadence`).
    """

    name: str
    storage: StorageLocation
    resources: Resources = Resources()
    space: SweepSpace | None = None
    search: OptunaPlan | None = None
    options: TuneOptions | None = None
    defaults: DatasetDefaults | None = None
    data_root: str | None = None
    demo: bool = False
    writes_demo_data: bool = False
    prepare_data: Callable[[], object] | None = None
    reference: str | None = None
    selection: Selection | None = None
    max_failures: int = 2
    keep_checkpoints: int = 2
    checkpoint_every: int = 1
    checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "storage", parse(self.storage, "--storage"))

    @property
    def resume(self) -> bool:
        return self.space is None
