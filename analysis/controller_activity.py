"""Whether ReLiF's controller acted: lambda over each trial's training, and a flag beside the
verdicts of a variant whose controller did not move lambda.

The controller (paper Eq. 12) moves log lambda by about eta x steps x mean(r~ - r*) over a
run, so an eta tuned for one budget can leave lambda where it started at another: ReLiF is
then ERM plus a fixed penalty lambda0 L_lip, and its verdicts say nothing of the adaptive
method. Per trial whose controller adapts lambda (`ReLiFConfig.controller_adapts`: not the
static-lambda or the without-Lipschitz ablation), from its per-step trace: lambda's lowest,
highest and final value, and eta x steps.

The rule (`INERT_BAND`): a trial's controller did not act where lambda stayed within 10% of
lambda0 at every step, i.e. lambda_t / lambda0 in [0.9, 1.1] throughout. A variant is flagged
where that holds on every seed ("controller inert"), or on some ("controller inert on k of n
seeds"). 10% is our choice (the paper has no such rule): lambda's bounds [0.01, 1] span two
decades, and a factor of 1.1 is about 2% of that span on the log scale.
"""

from __future__ import annotations

import pandas as pd

from relif_ray.analysis.experiment import Experiment
from relif_ray.analysis.render import display_text
from relif_ray.sweep.labels import recorded_controller_adapts

ACTIVITY_FILE = "controller_activity.csv"
"""The report's file of `controller_activity`: one row per trial whose controller adapts."""
INERT_BAND = 0.1
"""A controller did not act where |lambda_t / lambda0 - 1| <= INERT_BAND at every step."""

COLUMNS = [
    "variant", "seed", "trial", "lambda0", "lambda_low", "lambda_high", "lambda_final",
    "eta", "steps", "eta_x_steps", "inert",
]  # fmt: skip


def controller_activity(experiment: Experiment) -> pd.DataFrame:
    """One row per trial whose controller adapts lambda (`COLUMNS`), in the trials' order;
    empty where there is none or no trace."""
    trials = experiment.trials
    if trials.empty:
        return pd.DataFrame(columns=COLUMNS)
    chosen = trials[[recorded_controller_adapts(config["relif"]) for config in trials["config"]]]
    traces = experiment.traces if not chosen.empty else pd.DataFrame()
    if chosen.empty or "lambda" not in traces.columns:
        return pd.DataFrame(columns=COLUMNS)
    lambdas = traces.sort_values(["trial", "step"]).groupby("trial", observed=True)["lambda"]
    rows = []
    for trial in chosen.itertuples():
        if trial.trial not in lambdas.groups:
            continue
        values = lambdas.get_group(trial.trial)
        relif = trial.config["relif"]
        lambda0, eta, steps = float(relif["lambda0"]), float(relif["eta"]), int(trial.steps)
        inert = bool(((values / lambda0 - 1).abs() <= INERT_BAND).all())
        rows.append(
            [trial.variant, int(trial.seed), trial.trial, lambda0, float(values.min()),
             float(values.max()), float(values.iloc[-1]), eta, steps, eta * steps, inert]
        )  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def inert_flags(activity: pd.DataFrame) -> dict[str, str]:
    """Variant -> the flag beside its verdicts where its controller did not act on some seed
    (module docstring); variants whose controller acted on every seed have none."""
    flags = {}
    for variant, rows in activity.groupby("variant", sort=False):
        inert, n = int(rows["inert"].sum()), len(rows)
        if inert == n:
            flags[variant] = (
                f"controller inert: λ stayed within {INERT_BAND:.0%} of λ0 on every seed"
            )
        elif inert:
            flags[variant] = f"controller inert on {inert} of {n} seeds"
    return flags


def activity_section(activity: pd.DataFrame) -> str:
    """The report's section: per variant, lambda's range over training, its final value per
    seed, eta x steps, and the flag."""
    heading = "## Controller activity\n"
    if activity.empty:
        return heading + "No trial whose controller adapts λ.\n"
    note = (
        "Per variant whose controller adapts λ: λ's lowest and highest value over training "
        "(across its seeds), its final value per seed, and eta x steps (the controller moves "
        "log λ by about eta x steps x mean(r~ - r*); the paper's NYUv2 run has 19.8). "
        f"*Inert*: λ stayed within {INERT_BAND:.0%} of λ0 at every step (on k of n seeds); "
        "an inert controller leaves ReLiF as ERM plus a fixed penalty λ0 L_lip.\n"
    )
    flags = inert_flags(activity)
    rows = []
    for variant, group in activity.groupby("variant", sort=False):
        group = group.sort_values("seed")
        finals = ", ".join(f"{value:.3g}" for value in group["lambda_final"])
        etas = " / ".join(dict.fromkeys(f"{value:.3g}" for value in group["eta_x_steps"]))
        inert = f"{int(group['inert'].sum())} of {len(group)}"
        cells = [
            display_text(str(variant)),
            f"{group['lambda0'].iloc[0]:g}",
            f"[{group['lambda_low'].min():.3g}, {group['lambda_high'].max():.3g}]",
            finals,
            etas,
            inert + (" (flagged)" if variant in flags else ""),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    header = "| variant | λ0 | λ over training | final λ per seed | eta x steps | inert |"
    table = [header, "|---|---|---|---|---|---|", *rows]
    return "\n".join(
        [heading, note, *table, "", f"Per trial: [{ACTIVITY_FILE}]({ACTIVITY_FILE}).", ""]
    )
