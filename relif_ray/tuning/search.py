"""Optuna on Ray Tune: one multi-objective study per ReLiF label and seed, in one Tune run.

Each study is an Optuna study asked and told directly (Optuna's ask-and-tell interface, the
one Ray's `OptunaSearch` wraps). Its state is the list of its trials: parameters, state and
values. That list is the whole snapshot Tune keeps for `--resume` (`state`, plain JSON, never
a pickle): a study is rebuilt from it with `optuna.trial.create_trial` and `Study.add_trial`.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import asdict
from typing import Any

from ray.tune.search import Searcher

from relif_ray.directions import higher_is_better
from relif_ray.experiment.record import OBJECTIVES
from relif_ray.sweep.labels import variant
from relif_ray.sweep.plan import OptunaPlan
from relif_ray.sweep.trial_config import TrialSpec, tune_trial

TRIAL_STATES = ("running", "complete", "pruned", "fail")
"""A study trial's states, as its record holds them (Optuna's `TrialState` names)."""


class StudyGroups(Searcher):
    """One Optuna study per (ReLiF label, seed), interleaved in one Tune run.

    Each study samples (r*, eta) with TPE and learns only from its own trials. Suggestions go
    round-robin over the studies that still have budget, so all of them progress at the same
    pace. A study's n-th suggestion draws from a TPE sampler seeded from the study's name and
    n, so it depends only on the study, n and the trials the study had then: a sweep is
    reproducible, and a resumed one draws what it would have drawn without the interruption.
    A trial's outcome is told as Ray's `OptunaSearch` tells it: its objectives when its last
    result has both (finite), else failed (errored) or pruned (ended without them).
    """

    def __init__(self, plan: OptunaPlan) -> None:
        metrics, modes = list(OBJECTIVES), list(OBJECTIVES.values())
        super().__init__(metric=metrics, mode=modes)
        self._plan = plan
        self._trials: dict[str, list[dict[str, Any]]] = {name: [] for name in self._names()}
        self._turn = 0
        self._optuna: dict[str, Any] = {}  # the studies of `_trials`, rebuilt when needed

    def _names(self) -> list[str]:
        return [f"{label}/seed{seed}" for label in self._plan.labels for seed in self._plan.seeds]

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True

    def suggest(self, trial_id: str, ready: set[int] | None = None) -> dict | str | None:
        """The next study's suggestion, round-robin; with `ready`, only studies of those seeds
        draw (None while the others wait for their seed's ERM reference)."""
        names, waiting = self._names(), False
        for offset in range(len(names)):
            name = names[(self._turn + offset) % len(names)]
            if len(self._trials[name]) >= self._plan.num_samples:
                continue
            label, _, seed = name.rpartition("/seed")
            if ready is not None and int(seed) not in ready:
                waiting = True
                continue
            self._turn = (self._turn + offset + 1) % len(names)
            params = self._ask(name)
            self._trials[name].append({"trial_id": trial_id, "params": params, "state": "running"})
            item = variant(label, params["r_star"], params["eta"])
            return tune_trial(TrialSpec.of(item, int(seed), study=name))
        return None if waiting else Searcher.FINISHED

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        for name, records in self._trials.items():
            for number, record in enumerate(records):
                if record["trial_id"] == trial_id and record["state"] == "running":
                    self._tell(name, number, record, result, error)

    def _ask(self, name: str) -> dict[str, float]:
        from optuna.samplers import TPESampler  # deferred: Optuna loads for Optuna sweeps only

        study = self._study(name)
        study.sampler = TPESampler(seed=zlib.crc32(f"{name}#{len(self._trials[name])}".encode()))
        return dict(study.ask(fixed_distributions=self._space()).params)

    def _tell(self, name: str, number: int, record: dict, result: dict | None, error: bool):
        from optuna.trial import TrialState

        values = [(result or {}).get(metric) for metric in OBJECTIVES]
        if all(isinstance(v, int | float) and math.isfinite(v) for v in values):
            record.update(state="complete", values=[float(v) for v in values])
        else:
            record["state"] = "fail" if error or result else "pruned"
        state = TrialState[record["state"].upper()]
        self._study(name).tell(number, record.get("values"), state=state)

    def _space(self) -> dict[str, Any]:
        from optuna.distributions import FloatDistribution

        return {
            "r_star": FloatDistribution(*self._plan.r_star_range),
            "eta": FloatDistribution(*self._plan.eta_range, log=True),
        }

    def _study(self, name: str) -> Any:
        """The Optuna study of `name`, built from its records on first use."""
        if name not in self._optuna:
            import optuna
            from optuna.trial import TrialState, create_trial

            optuna.logging.set_verbosity(optuna.logging.WARNING)  # no line per study
            study = optuna.create_study(
                directions=["maximize" if higher_is_better(m) else "minimize" for m in OBJECTIVES],
                pruner=optuna.pruners.NopPruner(),
                study_name=name,
            )
            for record in self._trials[name]:
                trial = create_trial(
                    state=TrialState[record["state"].upper()],
                    values=record.get("values"),
                    params=record["params"],
                    distributions=self._space(),
                )
                study.add_trial(trial)
            self._optuna[name] = study
        return self._optuna[name]

    def keep_trials(self, trial_ids: set[str]) -> None:
        """Forget the running trials Tune does not know (a resumed run whose trial list is
        older than this snapshot): their suggestions are drawn again."""
        for name, records in self._trials.items():
            kept = [r for r in records if r["state"] != "running" or r["trial_id"] in trial_ids]
            if len(kept) != len(records):
                self._trials[name] = kept
                self._optuna.pop(name, None)

    def state(self) -> dict[str, Any]:
        """The snapshot of the studies: the plan, whose turn it is, each study's trials."""
        return {"plan": asdict(self._plan), "turn": self._turn, "trials": self._trials}

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from a `state` snapshot (a `KeyError`/`ValueError` if it is not one)."""
        plan = dict(state["plan"])
        plan.update(r_star_range=tuple(plan["r_star_range"]), eta_range=tuple(plan["eta_range"]))
        self._plan = OptunaPlan(**plan)
        trials = {
            name: [dict(record) for record in state["trials"][name]] for name in self._names()
        }
        for record in (record for records in trials.values() for record in records):
            if record["state"] not in TRIAL_STATES or not isinstance(record["params"], dict):
                raise ValueError(f"not a study trial: {record}")
        self._trials, self._turn, self._optuna = trials, int(state["turn"]), {}

    def save(self, checkpoint_path: str) -> None:
        """The `state` snapshot as JSON (Tune's `Searcher.save`)."""
        with open(checkpoint_path, "w") as file:
            json.dump(self.state(), file)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as file:
            self.load_state(json.loads(file.read()))
