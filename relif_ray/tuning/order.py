"""Same-seed ERM reference trials first: the squash constants that ReLiF trains on.

On a data set whose audit squashes some scores (NYUv2 depth/normal feature norms), the paper
squashes them with q10/q90 of the same-seed ERM validation run, and "the same scalar score is
used to form both the fixed-audit gaps and the training-time surrogate gaps" (section 3,
appendix A.3). So a ReLiF trial with `relif.squash = "erm"` cannot start before its seed's ERM
trial has finished. `ReferenceOrder` is the Tune searcher that hands out the sweep's trials in
that order:

- every trial that needs no reference (ERM itself, the other methods, every trial of a data set
  without squashed scores) at once, in the sweep's order;
- a dependent trial as soon as the ERM trial of its seed (and architecture:
  `relif_ray.reference.reference_key`) has finished; the driver then writes
  that trial's constants to `squash_constants.json` in the experiment directory (local, NFS or
  s3://), where the dependent trials read them at set-up and the audit reads them at analysis;
- when a seed's ERM trial errors, its dependent trials still start, with the reason in their
  config, and fail at set-up without training: they count as errored, never silently skipped.

Optuna studies (one per ReLiF label and seed) draw only for seeds whose reference is ready.
Tune snapshots the searcher beside its experiment state (`save`: JSON, with the studies' own
JSON state; never a pickle), so `--resume` continues across the phase boundary; the restored
order is rebuilt from the trials Tune resumes (`restore`). When
Tune fails to restore a run, it starts it over without its parameter space
(`relif_ray.tuning.resume`): the order then refuses to hand out trials, with a one-line error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from relif_ray.errors import UserError
from relif_ray.experiment import storage
from relif_ray.experiment.layout import tune_trials
from relif_ray.experiment.record import reported_constants, reported_seed_constants
from relif_ray.reference import read_squash_constants, write_squash_constants
from relif_ray.sweep.trial_config import TuneKeys, with_reference_error

SNAPSHOT_FORMAT = "relif-ray trial order 1"
"""What a snapshot of `ReferenceOrder` says it is (its "format"): JSON, never a pickle."""


class ReferenceOrder(Searcher):
    """Trial configs in dependency order; `studies` (a `StudyGroups`) once a seed is settled.

    items: each {"config": the trial's own part of its Tune config (label, seed, overrides;
        `relif_ray.sweep.plan.TrialOrder.tune_items`),
        "needs": reference key or None,
        "provides": reference key or None}; "provides" marks the ERM reference trial of that
        key (`relif_ray.reference.reference_key`: the seed, with the architecture where it is
        not hard sharing). A trial of fused seeds needs or provides a list, a key per seed.
    experiment_dir: where the driver writes `squash_constants.json` (constants already there,
        e.g. copied from `--reference`, count as ready).
    studies_need_reference: whether the studies' (ReLiF) trials depend on the reference.
    study_keys: seed -> the reference key of the studies' trials of that seed.
    """

    def __init__(
        self,
        items: list[dict[str, Any]],
        experiment_dir: str,
        studies: Any | None = None,
        studies_need_reference: bool = False,
        study_keys: dict[int, str] | None = None,
    ) -> None:
        super().__init__()
        self._study_keys = dict(study_keys or {})
        self._items = [dict(item) for item in items]
        self._pending = list(self._items)
        self._experiment_dir = experiment_dir
        self._studies = studies
        self._studies_need_reference = studies_need_reference
        self._ready: dict[str, dict[str, list[float]]] = read_squash_constants(experiment_dir)
        self._failed: dict[str, str] = {}
        self._providers: dict[str, str] = {}
        # True in the copy Tune pickles into tuner.pkl as the Tuner is built, which a resume
        # unpickles: a resumed run must `restore` this order before it hands out a trial.
        self._awaiting_restore = True

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        """Tune calls this as a NEW run starts (only with a parameter space, which a resumed
        run lacks): nothing to restore."""
        self._awaiting_restore = False
        return True

    def suggest(self, trial_id: str) -> dict | str | None:
        if self._awaiting_restore:
            raise UserError(
                f"--resume: Ray Tune could not restore the sweep at {self._experiment_dir} (its "
                "log above says why) and would start it over; nothing was started"
            )
        for index, item in enumerate(self._pending):
            needs = item.get("needs")
            if needs is None or self._settled(needs):
                del self._pending[index]
                if item.get("provides") is not None:
                    self._providers[trial_id] = _provided(item)
                return self._with_reference_error(dict(item["config"]), needs)
        studies_done = True
        if self._studies is not None:
            settled = {seed for seed, key in self._study_keys.items() if self._settled(key)}
            ready = settled if self._studies_need_reference else None
            suggestion = self._studies.suggest(trial_id, ready=ready)
            if isinstance(suggestion, dict):
                seed = TuneKeys.of(suggestion).seed
                key = self._study_keys.get(seed, str(seed))
                depends = key if self._studies_need_reference else None
                return self._with_reference_error(suggestion, depends)
            studies_done = suggestion == Searcher.FINISHED
        if self._pending or not studies_done:
            return None  # a trial waits for its seed's reference
        return Searcher.FINISHED

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        provided = self._providers.pop(trial_id, None)
        if provided is not None:
            ready = False
            for key, constants in provided_constants(provided, result or {}).items():
                if error or not constants:
                    self._failed[key] = f"the ERM reference trial of seed {key} errored"
                else:
                    self._ready[key], ready = constants, True
            if ready:
                write_squash_constants(self._experiment_dir, self._ready)
        if self._studies is not None:
            self._studies.on_trial_complete(trial_id, result, error)

    def _settled(self, needs: str | list[str]) -> bool:
        return all(str(key) in self._ready or str(key) in self._failed for key in _keys(needs))

    def _with_reference_error(self, config: dict, needs: str | list[str] | None) -> dict:
        """`config`, with the reason its reference errored where it depends on one that did."""
        reasons = [self._failed[str(key)] for key in _keys(needs) if str(key) in self._failed]
        return config if not reasons else with_reference_error(config, reasons[0])

    def save(self, checkpoint_path: str) -> None:
        """Tune's experiment-state snapshot of the order and of the Optuna studies, as JSON (a
        file this sweep writes and reads itself; Tune renames it into place, under its own
        name `searcher-state-*.pkl`, but never unpickles it: `restore`)."""
        state = {
            "format": SNAPSHOT_FORMAT,
            "items": self._items,
            "ready": self._ready,
            "failed": self._failed,
            "studies": self._studies.state() if self._studies is not None else None,
        }
        with open(checkpoint_path, "w") as file:
            json.dump(state, file)

    def restore(self, checkpoint_path: str) -> None:
        """The snapshot, reconciled with the trials Tune resumes. Tune copies its experiment
        state (the trial list) and this snapshot to storage one file after the other, in the
        background, so a driver killed in between leaves a snapshot older or newer than the
        trial list it resumes: items handed out since would be handed out again, or items
        handed out but never recorded would be lost. So an item is pending exactly when Tune
        resumes no trial of it (`resumed_trials`), a resumed reference that has not finished is
        awaited again, the constants file is the last word on which have finished, and a study
        forgets the running trials Tune does not resume. A file that is not this JSON
        snapshot (a pickle included, which is never loaded) is a one-line `UserError`."""
        state = read_snapshot(checkpoint_path)
        self._items = state["items"]
        self._ready = {**state["ready"], **read_squash_constants(self._experiment_dir)}
        unclaimed = resumed_trials(self._experiment_dir)
        if self._studies is not None and state["studies"] is not None:
            with storage.reading(Path(checkpoint_path)):
                self._studies.load_state(state["studies"])
            self._studies.keep_trials(set(unclaimed))
        self._pending, self._providers = [], {}
        for item in self._items:
            trial_id = next((t for t, config in unclaimed.items() if _is_of(item, config)), None)
            provides = item.get("provides")
            waited_for = any(str(key) not in self._ready for key in _keys(provides))
            if trial_id is None and (provides is None or waited_for):
                self._pending.append(item)
            elif trial_id is not None:
                del unclaimed[trial_id]
                if waited_for:
                    self._providers[trial_id] = _provided(item)
        awaited = {key for provided in self._providers.values() for key, _ in provided}
        self._failed = {key: why for key, why in state["failed"].items() if key not in awaited}
        self._awaiting_restore = False


def _keys(needs: str | list[str] | None) -> list[str]:
    """The reference keys of an item's "needs" or "provides" (a fused trial's: a list)."""
    if needs is None:
        return []
    return [str(key) for key in needs] if isinstance(needs, list) else [str(needs)]


def _provided(item: dict[str, Any]) -> list[tuple[str, int | None]]:
    """(key, seed) of each reference an item provides: a trial of one seed's key (seed None:
    its constants are at the top of its result), a fused trial's key per seed."""
    provides = item["provides"]
    if not isinstance(provides, list):
        return [(str(provides), None)]
    seeds = TuneKeys.of(item["config"]).seeds
    return [(str(key), seed) for key, seed in zip(provides, seeds, strict=True)]


def provided_constants(
    provided: list[tuple[str, int | None]], result: dict[str, Any]
) -> dict[str, dict[str, list[float]]]:
    """key -> the constants a finished reference trial reports for it (`_provided`)."""
    return {
        key: reported_constants(result) if seed is None else reported_seed_constants(result, seed)
        for key, seed in provided
    }


def read_snapshot(path: str) -> dict[str, Any]:
    """A `ReferenceOrder` snapshot (`ReferenceOrder.save`), checked: a file that is not one is
    a `UserError` naming it; nothing in it is executed."""
    with open(path, "rb") as file:
        data = file.read()
    with storage.reading(Path(path)):
        if not data.lstrip().startswith(b"{"):
            raise ValueError("not a JSON snapshot; a pickle is never loaded")
        state = json.loads(data)
        if not isinstance(state, dict) or state.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"not a {SNAPSHOT_FORMAT} snapshot")
        for key, kind in (("items", list), ("ready", dict), ("failed", dict)):
            if not isinstance(state[key], kind):
                raise ValueError(f"{key}: expected a JSON {kind.__name__}")
    return state


def resumed_trials(experiment_dir: str) -> dict[str, dict[str, Any]]:
    """trial id -> Tune config of every trial in the experiment state that `--resume`
    continues: the newest `experiment_state-*.json` of the experiment directory, the one
    Tune's own resume reads (`relif_ray.experiment.layout.tune_trials`)."""
    return tune_trials(experiment_dir)


def _is_of(item: dict[str, Any], config: dict[str, Any]) -> bool:
    """Whether a trial's Tune config is that of `item` (its own part, as JSON stores it)."""
    own = json.loads(json.dumps(item["config"]))
    return all(config.get(key) == value for key, value in own.items())
