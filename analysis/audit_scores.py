"""Every trial's audit scores on the shared audit interface, at analysis time.

Trials store RAW audit scores. Scores that are not probabilities (NYUv2 depth and normal) are
squashed here, identically for every method, with the validation quantiles of the same-seed
ERM reference (the squash: `relif_ray.squash`; the reference: `relif_ray.reference`). Both the
val and the test scores of a seed are squashed with those validation quantiles. Every other task
(segmentation's max softmax, the clinical probabilities) passes through unchanged. Another
audit interface of `relif_ray.squash.AUDIT_INTERFACES` (the wider q1/q99 squash, the ERM
empirical CDF) maps the same raw scores with the same reference's validation scores instead
(`audit_scores(experiment, interface)`).

The reference is the seed's plain ERM trial (`relif_ray.reference.is_plain_erm`). Where several
such trials share a seed (several experiment directories loaded together), the one from the
trial's own experiment directory is used; if that still leaves several, it is an error naming
the seed. A sweep that took its constants from another experiment (`--reference`) has no ERM
trial of its own: its `squash_constants.json` (the same numbers ReLiF trained on) is used
instead; with neither, it is an error naming the seed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from relif_ray.analysis.experiment import Experiment
from relif_ray.config import HARD_SHARING
from relif_ray.errors import UserError
from relif_ray.experiment import storage
from relif_ray.experiment.layout import SQUASH_CONSTANTS_FILE
from relif_ray.problems import benchmark
from relif_ray.reference import is_plain_erm, read_squash_constants, reference_key
from relif_ray.squash import PAPER_INTERFACE, audit_interface


def squashed_tasks(dataset: str) -> frozenset[str]:
    """Tasks of `dataset` whose stored audit score is not a probability: those whose task
    declares `score_is_probability = False` (`relif_ray.problems` registry)."""
    return benchmark(dataset, "data set of the trials").squashed_tasks


def is_erm(trials: pd.DataFrame) -> pd.Series:
    """Which trials are plain ERM (`relif_ray.reference.is_plain_erm`): the squash reference."""
    plain = [
        is_plain_erm(m, bool(r)) for m, r in zip(trials["method"], trials["relif"], strict=True)
    ]
    return pd.Series(plain, index=trials.index, dtype=bool)


def same_seed_erm(trials: pd.DataFrame) -> dict[str, tuple[list[str], bool]]:
    """For every trial, its same-seed ERM candidates: the plain ERM trials (`is_erm`) of its
    data set, architecture and seed from its own experiment directory, or, where that has
    none, from every loaded directory; and whether they are its own directory's. The squash
    reference and the Delta-M% baseline (`relif_ray.analysis.mtl_metrics.delta_m_per_trial`) are
    this one choice (`erm_partner`)."""
    erm: dict[tuple[str, str, int], list[tuple[str, str]]] = {}
    trials = with_architecture(trials)
    for row in trials[is_erm(trials)].itertuples():
        key = (row.dataset, row.architecture, row.seed)
        erm.setdefault(key, []).append((row.experiment, row.trial))
    candidates = {}
    for row in trials.itertuples():
        same = erm.get((row.dataset, row.architecture, row.seed), [])
        own = [trial for experiment, trial in same if experiment == row.experiment]
        candidates[row.trial] = (own, True) if own else ([trial for _, trial in same], False)
    return candidates


def erm_partner(trials: pd.DataFrame) -> dict[str, str | None]:
    """For every trial, THE same-seed ERM trial it is compared with (`same_seed_erm`): the
    one candidate, or None where there is none or several. Delta-M% and the paired
    comparisons over seeds (`relif_ray.analysis.paired`) pair by this one rule; a plain ERM trial is
    its own partner."""
    return {
        trial: same[0] if len(same) == 1 else None
        for trial, (same, _) in same_seed_erm(trials).items()
    }


def with_architecture(trials: pd.DataFrame) -> pd.DataFrame:
    """`trials` with an `architecture` column (hard sharing where a frame has none)."""
    if "architecture" in trials:
        return trials
    return trials.assign(architecture=HARD_SHARING)


def squash_reference(
    trials: pd.DataFrame, lent: dict[str, dict[str, dict[str, list[float]]]] | None = None
) -> dict[str, str]:
    """For every trial that has squashed tasks, the trial id of its same-seed ERM trial
    (`same_seed_erm`), or `SQUASH_CONSTANTS_FILE` where its experiment lends the constants
    (`lent`: experiment -> seed -> task -> [q10, q90]) and has no such trial."""
    lent = lent or {}
    candidates = same_seed_erm(trials)
    references = {}
    for row in with_architecture(trials).itertuples():
        if not squashed_tasks(row.dataset):
            continue
        same, own = candidates[row.trial]
        if not own and reference_key(row.seed, row.architecture) in lent.get(row.experiment, {}):
            references[row.trial] = SQUASH_CONSTANTS_FILE
            continue
        tasks = "/".join(sorted(squashed_tasks(row.dataset)))
        if not same:
            where = row.dataset
            if row.architecture != HARD_SHARING:
                where += f", {row.architecture}"
            raise UserError(
                f"no ERM trial with seed {row.seed} ({where}): the {tasks} audit "
                f"scores of seed {row.seed} are squashed with the validation quantiles of "
                "the same-seed ERM trial; add it or drop this seed"
            )
        if len(same) > 1:
            raise UserError(
                f"several ERM trials with seed {row.seed} ({', '.join(same)}); cannot choose "
                "the squash reference: load one experiment directory per sweep"
            )
        references[row.trial] = same[0]
    return references


def interface_constants(
    experiment: Experiment, interface: str = PAPER_INTERFACE
) -> list[tuple[str, str, str, np.ndarray]]:
    """(trial, squashed task, reference, constants) for every trial with squashed tasks: the
    interface's constants (`relif_ray.squash.AuditInterface.constants`) of the valid
    validation raw scores of its reference, the same-seed ERM trial, or the paper's q10/q90 of
    the experiment's `SQUASH_CONSTANTS_FILE`, which only the paper's interface can use."""
    mapping = audit_interface(interface)
    lent = {storage.display(path): read_squash_constants(path) for path in experiment.paths}
    references = squash_reference(experiment.trials, lent)
    scores = experiment.scores
    val = scores[(scores["split"] == "val") & scores["valid"]]
    val = val[val["trial"].isin(set(references.values()))]
    constants = {
        (str(trial), str(task)): mapping.constants(values.to_numpy(np.float64))
        for (trial, task), values in val.groupby(["trial", "task"], observed=True)["score"]
    }
    trials = with_architecture(experiment.trials).set_index("trial")
    rows = []
    for trial, reference in references.items():
        row = trials.loc[trial]
        for task in sorted(squashed_tasks(row["dataset"])):
            if reference == SQUASH_CONSTANTS_FILE:
                if interface != PAPER_INTERFACE:
                    raise UserError(
                        f"audit interface {interface!r}: trial {trial} has no same-seed ERM "
                        f"trial, only the q10/q90 of {row['experiment']}/{SQUASH_CONSTANTS_FILE}"
                        " (--reference); the other interfaces need the ERM validation scores"
                    )
                key = reference_key(row["seed"], row["architecture"])
                bounds = lent[row["experiment"]][key].get(task)
                values = None if bounds is None else np.asarray(bounds, dtype=np.float64)
            else:
                values = constants.get((reference, task))
            if values is None:
                raise UserError(
                    f"{reference}: no valid validation scores of task {task!r} for the squash "
                    "quantiles"
                )
            rows.append((trial, task, reference, values))
    return rows


def squash_quantiles(experiment: Experiment) -> pd.DataFrame:
    """The paper's q10/q90 per (trial, squashed task): trial, task, reference (the ERM trial,
    or the experiment's `SQUASH_CONSTANTS_FILE`), q10, q90."""
    rows = [
        (trial, task, reference, float(values[0]), float(values[1]))
        for trial, task, reference, values in interface_constants(experiment)
    ]
    return pd.DataFrame(rows, columns=["trial", "task", "reference", "q10", "q90"])


def audit_scores(experiment: Experiment, interface: str = PAPER_INTERFACE) -> pd.DataFrame:
    """Every trial's scores on the audit interface `interface` (`relif_ray.squash.
    AUDIT_INTERFACES`; default the paper's squash), all splits: `score` mapped where the task
    needs it, the stored value kept as `raw_score`."""
    mapping = audit_interface(interface)
    scores = experiment.scores.copy()
    scores["raw_score"] = scores["score"]
    scores["score"] = scores["score"].to_numpy(dtype=np.float64)
    constants = interface_constants(experiment, interface)
    if not constants:
        return scores
    trials, tasks = categorical(scores["trial"]), categorical(scores["task"])
    groups = (
        pd.DataFrame({"trial": trials.codes, "task": tasks.codes})
        .groupby(["trial", "task"])
        .indices
    )
    raw = scores["raw_score"].to_numpy(dtype=np.float64)
    mapped = scores["score"].to_numpy(dtype=np.float64, copy=True)
    for trial, task, _, values in constants:
        key = (trials.categories.get_loc(trial), tasks.categories.get_loc(task))
        rows = groups.get(key)
        if rows is not None:
            mapped[rows] = mapping.apply(raw[rows], values)
    scores["score"] = mapped
    return scores


def categorical(column: pd.Series) -> pd.Categorical:
    """The column as a Categorical (free when it already is one, as `analysis.load` makes)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.array
    return pd.Categorical(column.astype(object))
