"""Checks a sweep runs in the driver before Ray starts any trial (no Ray import).

A mistake that a trial would find only after the cluster has started, scheduled and retried it
is found here first, with the one-line `UserError` of the code that would have raised it in
the trial, so each rule keeps one home:

- every trial's config: the method is built with its options (`build_method`: unknown
  options, out-of-range values, a gradient source the method lacks) and the model is built on
  PyTorch's `meta` device, which allocates no memory (unknown backbone, pretrained weights
  that cannot be loaded, options the model rejects, an architecture that does not apply to
  the data set, the representation-gradient mode on an architecture without one encoder
  output every head reads); the straight-through squash gradient, the logistic surrogate
  score and the clip-share penalty are refused where the data set has no squashed score
  (`check_squash_gradient`);
- the data set: the benchmark's `check(root)` (every file present and readable, shapes and
  dtypes from file headers, small files parsed whole);
- the storage: a supported kind, and a local `--storage` creatable and writable; nothing is
  created here;
- pretrained weights given as a file must exist (`resolve_pretrained`);
- `--resume`: the experiment exists and holds a sweep to continue (`check_resumable`).
"""

from __future__ import annotations

import json
import warnings
from fnmatch import fnmatch
from pathlib import Path

import torch

from relif_ray.config import ExperimentConfig
from relif_ray.errors import UserError, first_line
from relif_ray.experiment.layout import (
    EXPERIMENT_STATE_FILES,
    SEARCHER_STATE_FILES,
    SQUASH_CONSTANTS_FILE,
    newest_driver_state,
    newest_trial_list,
    trial_list_states,
)
from relif_ray.experiment.storage import (
    DamagedFile,
    Location,
    check_writable,
    display,
    filesystem,
    join,
    location,
    read_bytes,
    resolved,
)
from relif_ray.fusion import fusion_refusal
from relif_ray.methods import build_method
from relif_ray.models.base import check_gradient_source
from relif_ray.problems import benchmark, checked_model, use_spec
from relif_ray.reference import read_squash_constants


def check_trial_configs(configs: list[ExperimentConfig]) -> None:
    """Build each distinct method and model of `configs` once, as a trial would."""
    built: set[str] = set()
    for config in configs:
        use_spec(config.data)
        if config.train.fused_seeds > 1 and (reason := fusion_refusal(config)) is not None:
            raise UserError(f"--fused-seeds: {reason}")
        described = benchmark(config.data.dataset, "config field data.dataset")
        check_squash_gradient(config, described.squashed_tasks)
        method = config.method
        if repr((config.data.dataset, method)) not in built:
            built.add(repr((config.data.dataset, method)))
            build_method(
                method.name,
                [task.name for task in described.tasks()],
                config.seed,
                gradient_source=method.gradient_source,
                **method.options,
            )
        key = repr((config.data.dataset, config.model, method.gradient_source))
        if described.model is not None and key not in built:
            built.add(key)
            with torch.device("meta"), warnings.catch_warnings():
                # loading pretrained weights into meta parameters copies nothing, by design
                warnings.filterwarnings("ignore", ".*copying from a non-meta parameter")
                model = checked_model(described.model, config.model)
            check_gradient_source(model, method.gradient_source)


def check_fused_sweep(base: ExperimentConfig, scheduler: str, per_seed_settings: bool) -> None:
    """`train.fused_seeds` > 1 in a sweep that acts on one seed at a time is refused in one
    line: ASHA stops a trial (all its seeds) on their mean; Optuna's studies and
    `--select-from` give each seed settings of its own. The trials' configs are checked by
    `check_trial_configs` (`relif_ray.fusion.fusion_refusal`)."""
    if base.train.fused_seeds == 1:
        return
    if scheduler == "asha":
        raise UserError(
            "--fused-seeds: ASHA stops trials per seed setting; fused seeds would be stopped "
            "together (use --fused-seeds 1 or --scheduler fifo)"
        )
    if per_seed_settings:
        raise UserError(
            "--fused-seeds: --search optuna and --select-from give each seed settings of its "
            "own, so its seeds are not one setting (use --fused-seeds 1)"
        )


def check_squash_gradient(config: ExperimentConfig, squashed_tasks: frozenset[str]) -> None:
    """`relif.squash_gradient: straight_through`, `relif.surrogate_score: logistic` and
    `relif.clip_share_penalty` change only what ReLiF does with squashed scores; on a data set
    whose audit scores are all probabilities each would train exactly as `relif`, so a sweep
    asking for one is a mistake."""
    relif = config.relif
    if not relif.enabled or squashed_tasks:
        return
    squash_only = (
        ("squash_gradient", "straight_through", "relif-st"),
        ("surrogate_score", "logistic", "relif-logistic"),
        ("clip_share_penalty", True, "relif-clipshare"),
    )
    chosen = next((item for item in squash_only if getattr(relif, item[0]) == item[1]), None)
    if chosen:
        field, value, label = chosen
        shown = str(value).lower() if isinstance(value, bool) else value
        raise UserError(
            f"config field relif.{field}: {shown} (label {label}) changes nothing on "
            f"{config.data.dataset}, whose audit scores are all probabilities (no squash); "
            "use relif"
        )


def check_data(dataset: str, root: str) -> None:
    """The benchmark's header-level check of the data set at `root` (if it has one)."""
    described = benchmark(dataset, "config field data.dataset")
    if described.check is not None:
        described.check(root)


def lent_constants(reference: str) -> dict[str, dict[str, list[float]]]:
    """The same-seed ERM squash constants an experiment lends through `--reference` (seed ->
    task -> [q10, q90]); a one-line error when it has none."""
    place = location(reference, "--reference")
    try:
        constants = read_squash_constants(place)
    except DamagedFile as error:
        raise UserError(f"--reference {display(place)}: {error}") from None
    if not constants:
        raise UserError(f"--reference {display(place)}: no {SQUASH_CONSTANTS_FILE} there")
    return constants


def check_storage(storage: Location) -> None:
    """`--storage`: a supported kind of storage; a local one a directory we can write into, or
    creatable below its nearest existing parent (`relif_ray.experiment.storage.check_writable`);
    an object store (s3://, gs://) must answer (one request; whether we may write there is left
    to Ray's storage layer). A store that cannot be reached once the sweep runs stops it
    resumably (`relif_ray.tuning.launch.stopping`)."""
    if check_writable(storage, "--storage") is not None:
        return
    store, path = filesystem(location(storage))
    try:
        store.get_file_info(path)
    except OSError as error:
        reason = first_line(error)
        raise UserError(
            f"--storage {display(storage)}: the store does not answer ({reason})"
        ) from None


def check_resumable(storage: Location, name: str) -> None:
    """`--resume`: the experiment `<storage>/<name>` must hold a sweep Ray Tune can continue
    (its trial list, `relif_ray.experiment.layout.EXPERIMENT_STATE_FILES`), our searcher's
    snapshot must be the JSON we write (a pickle is refused, never loaded; a cut-off one is
    left to `relif_ray.tuning.resume`) and its squash constants readable: all found before
    Ray starts (the storage itself is checked once, when the command reads its flags)."""
    experiment = join(resolved(storage), name)
    newest = newest_driver_state(experiment)  # one listing: what exists, and what to read
    if not any(fnmatch(file, EXPERIMENT_STATE_FILES) for file in newest):
        raise UserError(
            f"--resume: no sweep to resume at {display(experiment)} (check --storage and --name)"
        )
    for file in newest:
        data = read_bytes(join(experiment, file)).lstrip()
        if fnmatch(file, SEARCHER_STATE_FILES) and data and not data.startswith(b"{"):
            raise UserError(
                f"--resume: {display(join(experiment, file))} is not the JSON snapshot of a "
                "sweep's trial order (a pickle is never loaded); the sweep cannot be resumed"
            )
        if fnmatch(file, EXPERIMENT_STATE_FILES) and is_json(data):  # not Tune's list: damaged
            trial_list_states(join(experiment, file), json.loads(data))  # read once, above
    read_squash_constants(experiment)


def sweep_exists(storage: Location, name: str) -> bool:
    """Whether `<storage>/<name>` holds a sweep Ray Tune can continue: its trial list
    (`relif_ray.experiment.layout.EXPERIMENT_STATE_FILES`), which Tune writes when the sweep's
    first trial is created."""
    return newest_trial_list(join(resolved(storage), name)) is not None


def is_json(data: bytes) -> bool:
    """Whether `data` is a whole JSON document (a file cut off by a killed driver is not; it is
    put back, or refused, once Ray is up: `relif_ray.tuning.resume`)."""
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def resolve_pretrained(value: str) -> str:
    """model.pretrained as the trials will read it: none, imagenet, or the absolute path of a
    state_dict file that exists here."""
    if value in ("none", "imagenet"):
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise UserError(f"model.pretrained: no such state_dict file: {value}")
    return str(path.resolve())
