"""What Ray Tune is given of a sweep's storage, and what it must not be given: a path and a
filesystem that hold no credentials, and trial actors whose `runtime_env` carries none.

A storage URI's credentials leave it where it is first read (`relif_ray.experiment.storage.
take_credentials`) for this process's environment; Arrow reads them there, and so does every
trial of a local Ray, which inherits the driver's environment. Ray writes what Tune hands it
(its state, each trial's config and `runtime_env`) into files of the experiment, the bucket and
Ray's session folder, so nothing handed to Tune may carry them.
"""

from __future__ import annotations

import pyarrow.fs as pafs

from relif_ray.experiment.storage import Location, filesystem, local_path

CREDENTIALS_TUNE_COPIES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SECURITY_TOKEN",
    "AWS_SESSION_TOKEN",
)
"""The driver's environment variables that Ray Tune 2.60 copies into each trial actor's
`runtime_env` (`ray.tune.execution.class_cache.ENV_VARS_TO_PROPAGATE`)."""


def keep_credentials_out_of_runtime_env() -> None:
    """Tell Ray Tune not to copy the driver's AWS credentials (`CREDENTIALS_TUNE_COPIES`) into
    its trial actors' `runtime_env`: Ray's runtime-env agent writes every runtime_env, variables
    and all, to `logs/runtime_env_agent.log` in the session folder of each node that starts a
    trial, so the secret would be on disk there. The trials of a local Ray, which the driver
    starts, inherit the driver's environment instead (a storage URI's credentials among them:
    `relif_ray.experiment.storage.take_credentials`), which Ray writes nowhere; a cluster's
    nodes read the store with their own credentials (environment, profile or role)."""
    from ray.tune.execution import class_cache

    class_cache.ENV_VARS_TO_PROPAGATE.difference_update(CREDENTIALS_TUNE_COPIES)


def tune_storage(place: Location) -> tuple[str, pafs.FileSystem | None]:
    """`place` (a sweep's storage or experiment directory) as Ray Tune takes it: a local path
    as it is (no filesystem); in object storage, the path inside the store and the store's
    filesystem (`relif_ray.experiment.storage.filesystem`, the one our own readers use). Tune
    pickles that filesystem into its state (`tuner.pkl`, every trial's storage in
    `experiment_state-*.json`) and into each trial's actor; it holds no credentials (Arrow
    takes them from the environment, where a URI's went: `storage.take_credentials`), so
    neither does anything Tune writes; a trial's worker finds them in its own environment."""
    if local_path(place) is not None:
        return str(place), None
    store, path = filesystem(place)
    return path, store
