"""The prose of `report.md` (`relif_ray.analysis.report`) about the audit: its sections, each a
Markdown string built from the experiment, the `Results` and the tables, following the paper's
reporting checklist (section 6): the audit protocol, each table's section with its figures, the
Pareto front and the audit interfaces. The sections that say what ran (sources, training and
controller settings, trials without outputs) are `relif_ray.analysis.provenance`'s, the Summary
of verdicts over seeds is `relif_ray.analysis.summary`'s."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from relif_ray.analysis.audit_scores import squashed_tasks
from relif_ray.analysis.experiment import Experiment
from relif_ray.analysis.fronts import pareto_means
from relif_ray.analysis.interfaces import TITLE, interface_words
from relif_ray.analysis.provenance import controller_settings, training_settings
from relif_ray.analysis.render import Table, display_text
from relif_ray.analysis.results import Results
from relif_ray.analysis.tables import CISettings, Skipped
from relif_ray.analysis.verdicts import VerdictSettings
from relif_ray.audit import AuditSettings
from relif_ray.squash import SQUASH_FORMULA


def section(
    title: str, table: Table | Skipped, ci: CISettings, extra: str = "", level: int = 2
) -> str:
    heading = "#" * level + f" {title}\n"
    if isinstance(table, Skipped):
        return heading + f"Skipped: {table.reason}.\n"
    lines = [heading, table.title + "\n", table.markdown()]
    if ci.n_boot > 0 and any(
        c.key.startswith("bias") or c.key == "raw_bias" for c in table.columns if c.kind == "stat"
    ):
        lines.append(
            f"Bias cells: mean ± sample std over seeds [{ci.level:.0%} percentile bootstrap "
            f"interval of the seed mean over the audit's sampled pairs, {ci.n_boot} "
            "replicates: the pair-sampling uncertainty only, not an interval over seeds; "
            "seeds: the summary's verdicts].\n"
        )
    files = ", ".join(link(f"tables/{table.name}.{kind}") for kind in ("md", "tex", "csv"))
    lines.append(f"Files: {files}.\n")
    if extra:
        lines.append(extra + "\n")
    return "\n".join(lines)


def link(relative: str) -> str:
    """A Markdown link to a file of the report folder (`relative` to report.md)."""
    return f"[{relative.rpartition('/')[2]}]({relative})"


def figure_line(path: Path | None) -> str:
    return f"![{path.stem}](figures/{path.name})" if path else ""


def protocol(experiment: Experiment, results: Results, settings: AuditSettings) -> str:
    datasets = sorted(set(experiment.trials["dataset"]))
    squashed = sorted({t for d in datasets for t in squashed_tasks(d)})
    interface = (
        f"audit scores of {', '.join(squashed)} are raw (unbounded: feature norms, "
        f"regression predictions), squashed by "
        f"{SQUASH_FORMULA} with q10/q90 of the SAME-SEED ERM trial's "
        "validation scores, identically for every method (values in "
        f"{link('squash_quantiles.csv')}; two other interfaces: {TITLE}); "
        "the other tasks' scores are probabilities and pass unchanged"
        if squashed
        else "all audit scores are probabilities in [0, 1] and are used unchanged"
    )
    lines = [
        "## Audit protocol (reporting checklist)\n",
        f"- Audit split: **{results.split}**. Audit interface: {interface}.",
        f"- Pools and pairs (Algorithm 1): per task a pool of N_eval = {settings.pool_size} "
        f"valid examples drawn without replacement with eval_seed = {settings.eval_seed} "
        f"(all of them when a task has fewer); per unordered task pair S = {settings.pairs} "
        f"pairs drawn uniformly with replacement with pair_seed = {settings.pair_seed}. "
        "Bias = mean (|p_a(x) - p_b(y)| - δ)_+, VR = mean 1[gap > δ], averaged over task "
        "pairs (weights 1/#pairs).",
        "- δ_ref, chosen once and held fixed for every method and every table "
        f"(primary: {results.primary.symbol}; values and sources in {link('delta_ref.json')}):",
    ]
    for delta in results.deltas:
        lines.append(f"  - {delta.symbol} = {delta.value:.6f}: {delta.source}.")
    lines += [
        "- Method-induced thresholds (validation split, the mean cosine-induced distance of "
        "each method's own representations over the audit's pairs) are reported only as "
        "threshold-drift diagnostics; methods are compared under δ_ref (per task pair: "
        f"{link('induced_thresholds.csv')}).",
        "- Utility metrics are those of the same checkpoint whose audit scores are audited "
        "(each trial's final checkpoint). The per-trial numbers behind every table: "
        f"{link('per_trial.csv')}.",
        "- Training settings (optimiser, budget, learning-rate schedule) of every method and "
        "controller settings of every ReLiF variant: see *Training settings* and *Controller "
        "settings* below.",
        "",
    ]
    return "\n".join(lines)


def pareto_section(
    results: Results,
    figure: Path | None,
    hypervolume: Table | Skipped,
    ci: CISettings,
    settings: VerdictSettings,
) -> str:
    means = pareto_means(results, settings)
    front = ", ".join(
        display_text(row.variant) + _share_text(row.front_share)
        for row in means[means["on_front"]].itertuples()
    )
    return "\n".join(
        [
            "## Utility-fairness Pareto front\n",
            f"Fixed-δ Bias@{results.primary.symbol} (lower is better) against Worst (higher is "
            f"better). Non-dominated methods (means over seeds): **{front}**; a mean on the "
            "front is one draw of the seeds, and front_share is the share of seed resamples "
            "(every method's seeds resampled together) in which it stays there. Per-seed points "
            f"and per-method means: {link('pareto_points.csv')}, {link('pareto_means.csv')}.\n",
            figure_line(figure) + "\n",
            section("Hypervolume", hypervolume, ci, level=3),
        ]
    )


def _share_text(share: float) -> str:
    return "" if pd.isna(share) else f" (on the front in {share:.0%} of seed resamples)"


def interface_section(table: Table | Skipped, ci: CISettings) -> str:
    """The audit-interface table, its verdicts in words and its per-trial file."""
    extra = interface_words(table)
    if not isinstance(table, Skipped):
        extra += f"\n\nPer trial and interface: {link('interface_per_trial.csv')}."
    return section(TITLE, table, ci, extra)


def audited_sections(
    experiment: Experiment,
    results: Results,
    settings: AuditSettings,
    ci: CISettings,
    named: dict[str, Table | Skipped],
    figures: dict,
    verdicts: VerdictSettings,
) -> list[str]:
    """The sections after the sources: the audit protocol, then each table (by name, as
    `relif_ray.analysis.report` built them) with its figures, in the order of the paper's
    checklist."""
    return [
        protocol(experiment, results, settings),
        section(
            "Utility and fixed-δ Bias",
            named["main"],
            ci,
            "Utility metrics and audit scores come from the same (final) checkpoint.",
        ),
        section("Paired comparisons with same-seed ERM, over seeds", named["paired"], ci),
        section("Violation rates", named["violation"], ci),
        section(
            "Audit-score saturation",
            named["saturation"],
            ci,
            figure_line(figures.get("score_distributions")),
        ),
        interface_section(named["interfaces"], ci),
        pareto_section(results, figures.get("pareto"), named["hypervolume"], ci, verdicts),
        "## Threshold-drift diagnostics (not the comparison metric)\n",
        section("Method-induced thresholds", named["drift"], ci, level=3),
        section(
            "Raw versus fixed-δ ranking",
            named["shift"],
            ci,
            figure_line(figures.get("rank_shift")),
            level=3,
        ),
        section("Theorem B.2 ranking certificate", named["certificate"], ci, level=3),
        section("ReLiF component ablation", named["ablation"], ci),
        section(
            "δ-sensitivity",
            named["delta_sensitivity"],
            ci,
            figure_line(figures.get("delta_sensitivity")),
        ),
        section(
            "Controller sensitivity",
            named["controller"],
            ci,
            "\n".join(figure_line(path) for path in figures.get("controller", [])),
        ),
        training_settings(experiment.trials),
        controller_settings(experiment.trials),
        section("All utility metrics", named["utility"], ci),
    ]
