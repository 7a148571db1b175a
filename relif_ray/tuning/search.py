"""Optuna on Ray Tune: one multi-objective study per ReLiF label and seed, in one Tune run."""

from __future__ import annotations

import pickle
import zlib

from ray.tune.search import Searcher

from relif_ray.directions import tune_mode
from relif_ray.sweep.labels import variant
from relif_ray.sweep.plan import OptunaPlan
from relif_ray.sweep.trial_config import trial_overrides

OBJECTIVES = {name: tune_mode(name) for name in ("val_bias", "worst")}
"""Optuna's objectives: live validation Bias (minimized) and validation Worst (maximized)."""


class StudyGroups(Searcher):
    """One OptunaSearch (one study) per (ReLiF label, seed), interleaved in one Tune run.

    Each study samples (r*, eta) with its own TPE sampler (seeded from the study name, so a
    sweep is reproducible) and learns only from its own trials. Suggestions go round-robin over
    the studies that still have budget, so all of them progress at the same pace.
    """

    def __init__(self, plan: OptunaPlan) -> None:
        # Deferred: Ray's Optuna searcher and Optuna load only for an Optuna sweep.
        from optuna.distributions import FloatDistribution
        from optuna.samplers import TPESampler
        from ray.tune.search.optuna import OptunaSearch

        metrics, modes = list(OBJECTIVES), list(OBJECTIVES.values())
        super().__init__(metric=metrics, mode=modes)
        space = {
            "r_star": FloatDistribution(*plan.r_star_range),
            "eta": FloatDistribution(*plan.eta_range, log=True),
        }
        self._studies = []
        for label in plan.labels:
            for seed in plan.seeds:
                name = f"{label}/seed{seed}"
                searcher = OptunaSearch(
                    space=dict(space),
                    metric=metrics,
                    mode=modes,
                    sampler=TPESampler(seed=zlib.crc32(name.encode())),
                    study_name=name,
                )
                self._studies.append(
                    {"name": name, "label": label, "seed": seed, "searcher": searcher}
                )
        self._remaining = {study["name"]: plan.num_samples for study in self._studies}
        self._trial_study: dict[str, dict] = {}
        self._turn = 0

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True

    def suggest(self, trial_id: str, ready: set[int] | None = None) -> dict | str | None:
        """The next study's suggestion, round-robin; with `ready`, only studies of those seeds
        draw (None while the others wait for their seed's ERM reference)."""
        waiting = False
        for offset in range(len(self._studies)):
            study = self._studies[(self._turn + offset) % len(self._studies)]
            if self._remaining[study["name"]] <= 0:
                continue
            if ready is not None and study["seed"] not in ready:
                waiting = True
                continue
            self._turn = (self._turn + offset + 1) % len(self._studies)
            self._remaining[study["name"]] -= 1
            self._trial_study[trial_id] = study
            params = study["searcher"].suggest(trial_id)
            item = variant(study["label"], params["r_star"], params["eta"])
            return {"study": study["name"], **trial_overrides(item, study["seed"])}
        return None if waiting else Searcher.FINISHED

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        study = self._trial_study.get(trial_id)
        if study is not None:
            study["searcher"].on_trial_complete(trial_id, result, error)

    def save(self, checkpoint_path: str) -> None:
        """Tune's experiment-state snapshot of the studies (written and read by this sweep)."""
        with open(checkpoint_path, "wb") as file:
            pickle.dump(self.__dict__, file)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as file:
            self.__dict__.update(pickle.load(file))
