"""The Ray Tune layer, the only package of the library that imports Ray.

`driver`: a checked sweep (`relif_ray.sweep.request.SweepRequest`) run or resumed, entered
through `run_sweep_request`; `trainable`: one trial (`ReLiFTrainable`) and its live validation
audit; `search`: the Optuna studies (`StudyGroups`); `order`: same-seed ERM reference trials
before the trials that wait for them (`ReferenceOrder`); `launch`: connect, cluster and
storage checks, `run_sweep`, the studies' `pareto.csv`; `resume`: the driver state a killed
driver cut off, checked before `--resume`; `stop`: SIGTERM, SIGUSR1 and SIGINT as Tune's
graceful stop; `tune_storage`: the storage as Tune takes it, without credentials;
`integrations`: schedulers and logger callbacks; `errored_trials`, `user_errors`: errored
trials. What to run is planned without Ray in
`relif_ray.sweep`. This package's own module imports no Ray when it is imported:
`run_sweep_request` first keeps a local Ray on 127.0.0.1 (`keep_local_ray_on_loopback`), then
imports the driver and with it Ray.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relif_ray.sweep.request import SweepRequest

LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch for whether "this node" is the machine's network address ("1", the default on
Linux) or 127.0.0.1 ("0", the default on macOS and Windows). Ray reads it once, on import."""


def keep_local_ray_on_loopback() -> None:
    """Make the local Ray that this process starts bind to 127.0.0.1 only, as on a laptop.

    On Linux `ray.init()` binds its processes (GCS, raylet, workers) to the machine's network
    address, where other machines may reach them; a sweep on local Ray needs none of that, and
    `ray.init(_node_ip_address="127.0.0.1")` does not help (Ray rewrites a loopback address to
    the network one). Setting `LOOPBACK_SWITCH` to "0" does; it takes effect only if set
    before Ray is imported, and it is left as the user set it. Not for a driver that joins a
    cluster (`--address`): it would look for its node's raylet at 127.0.0.1.
    """
    os.environ.setdefault(LOOPBACK_SWITCH, "0")


def run_sweep_request(request: SweepRequest) -> str:
    """Run (or resume) a checked sweep (`relif_ray.tuning.driver.run`); its experiment
    directory. A sweep on local Ray is kept on 127.0.0.1 before Ray is imported here."""
    if not request.resources.address:
        keep_local_ray_on_loopback()
    from relif_ray.tuning.driver import run  # imports Ray

    return run(request)
