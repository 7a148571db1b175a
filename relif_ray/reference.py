"""The same-seed ERM reference: which trial it is, who waits for it, and where its squash
constants travel.

The squash that maps non-probability audit scores into [0, 1] and the other audit interfaces
are plain math in `relif_ray.squash`. Their constants come from the valid
VALIDATION raw scores of the ERM trial with the SAME seed and data set (and architecture,
`reference_key`): plain ERM (method `erm`, ReLiF off) is the reference. One squash serves
three places (paper section 3, appendix A.3):

- the fixed-delta audit at analysis time (`relif_ray.analysis.audit_scores`; val and test
  scores of a seed alike, with that seed's validation quantiles);
- ReLiF's training surrogate (`relif_ray.relif.regularizer`, `relif.squash = "erm"`), so a
  sweep runs each seed's ERM trial before the ReLiF trials that wait for it
  (`waits_for_reference`, `relif_ray.tuning.order`);
- a trial's live validation audit (`relif_ray.tuning.trainable`), with its seed's constants
  where it has them, else with its own validation quantiles (a progress signal only).

The constants travel in the experiment directory as `squash_constants.json`
(`relif_ray.experiment.layout.SQUASH_CONSTANTS_FILE`; reference key -> task -> [q10, q90],
the key being the seed, or `<architecture>:<seed>` for an architecture other than hard
sharing: `reference_key`), written by the sweep driver when a seed's ERM trial finishes and
read by the waiting trials, by `--reference` sweeps and by the audit (`read_squash_constants`,
`write_squash_constants`).
"""

from __future__ import annotations

import json
import math

import pyarrow.fs

from relif_ray.config import HARD_SHARING, DataConfig, ExperimentConfig
from relif_ray.experiment import storage
from relif_ray.experiment.layout import SQUASH_CONSTANTS_FILE
from relif_ray.experiment.storage import Location
from relif_ray.squash import SQUASH_QUANTILES


def reference_key(seed: int, architecture: str = HARD_SHARING) -> str:
    """Which reference a trial has, as `SQUASH_CONSTANTS_FILE` and the sweep's order file it:
    its seed, and for an architecture other than hard sharing `<architecture>:<seed>`. Each
    architecture's ERM trial is the reference of its own trials: the squashed scores are norms
    of the model's own decoder feature maps (a sweep over architectures runs one ERM trial per
    architecture and seed)."""
    return str(seed) if architecture == HARD_SHARING else f"{architecture}:{seed}"


def config_reference_key(config: ExperimentConfig) -> str:
    """`reference_key` of a trial's config."""
    return reference_key(config.seed, config.model.architecture)


def is_plain_erm(method: str, relif_enabled: bool) -> bool:
    """Plain ERM: method `erm` with ReLiF off, the only trial that can be a reference."""
    return method == "erm" and not relif_enabled


def has_squashed_scores(data: DataConfig) -> bool:
    """Whether the audit of `data`'s benchmark squashes some task's scores (its tasks declare
    `score_is_probability = False`), so that its ReLiF trials need a reference."""
    from relif_ray.problems import benchmark, use_spec  # deferred: the registry imports torch

    use_spec(data)
    return bool(benchmark(data.dataset).squashed_tasks)


def is_reference(config: ExperimentConfig) -> bool:
    """Whether a trial is an ERM reference: plain ERM on a data set with squashed scores."""
    plain = is_plain_erm(config.method.name, config.relif.enabled)
    return plain and has_squashed_scores(config.data)


def waits_for_reference(config: ExperimentConfig) -> bool:
    """Whether a trial trains on same-seed ERM squash constants it does not have yet: ReLiF
    with the paper's squash (`relif.squash = "erm"`) on a data set with squashed scores."""
    relif = config.relif
    if not relif.enabled or relif.squash != "erm" or relif.squash_constants:
        return False
    return has_squashed_scores(config.data)


def read_squash_constants(experiment_dir: Location | str) -> dict[str, dict[str, list[float]]]:
    """reference key (`reference_key`) -> task -> [q10, q90] from the experiment's
    `SQUASH_CONSTANTS_FILE` (local, file://, s3://, ...: `relif_ray.experiment.storage`);
    empty when there is none (yet)."""
    place = storage.join(storage.location(experiment_dir), SQUASH_CONSTANTS_FILE)
    if storage.file_type(place) == pyarrow.fs.FileType.NotFound:
        return {}
    record = storage.read_json(place)
    with storage.reading(place):  # a record without seeds or [q10, q90] pairs is damaged
        return {
            str(key): {str(task): _bounds(key, task, bounds) for task, bounds in tasks.items()}
            for key, tasks in record["seeds"].items()
        }


def _bounds(key: object, task: object, bounds: object) -> list[float]:
    """[q10, q90] of one reference key and task as the record holds it: two finite numbers,
    in order."""
    values = list(bounds) if isinstance(bounds, list) else []
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    finite = numbers and all(math.isfinite(v) for v in values)
    if len(values) != 2 or not finite or not values[0] <= values[1]:
        raise ValueError(f"reference {key}, task {task}: expected [q10, q90], got {bounds!r}")
    return [float(value) for value in values]


def write_squash_constants(
    experiment_dir: Location | str, constants: dict[str, dict[str, list[float]]]
) -> None:
    """Replace the experiment's `SQUASH_CONSTANTS_FILE` as a whole
    (`storage.write_bytes_atomically`: readers never see half a file)."""
    place = storage.location(experiment_dir)
    store, root = storage.filesystem(place)
    store.create_dir(root, recursive=True)
    record = {"quantiles": list(SQUASH_QUANTILES), "seeds": constants}
    text = json.dumps(record, indent=2, sort_keys=True).encode()
    storage.write_bytes_atomically(storage.join(place, SQUASH_CONSTANTS_FILE), text)
