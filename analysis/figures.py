"""Figures: Pareto fronts (paper Figure 2), controller traces, delta-sensitivity curves, the
raw against the fixed-delta ranking.

Figures are built on `matplotlib.figure.Figure` with the Agg canvas, so writing PNGs needs no
display and changes no global pyplot state; in Jupyter the returned figures display inline.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from relif_ray.analysis.experiment import Experiment
from relif_ray.analysis.fronts import pareto_means, pareto_points
from relif_ray.analysis.render import display_text
from relif_ray.analysis.results import Results
from relif_ray.analysis.verdicts import VerdictSettings
from relif_ray.experiment.record import EVALUATED, VAL_BIAS, VAL_WORST
from relif_ray.sweep.labels import recorded_controller_adapts

DELTA_LINE_STYLES = (":", "-.", "--")
"""Line styles of the held-fixed delta_ref markers, in the order of the deltas."""


def _figure(width: float, height: float, columns: int = 1) -> tuple[Figure, list]:
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, columns, squeeze=False)[0]
    return figure, list(axes)


def _colors(variants: Sequence[str]) -> dict[str, tuple]:
    from matplotlib import colormaps

    palette = colormaps["tab10"]
    return {variant: palette(index % 10) for index, variant in enumerate(variants)}


def pareto_figure(
    results: Results, title: str | None = None, settings: VerdictSettings | None = None
) -> Figure:
    """Per-seed points (small dots), per-method means with ± std bars (large markers), and the
    non-dominated means joined by a dashed line where there are two or more; x = fixed-delta
    Bias, y = Worst. Each method's legend entry gives the share of seed-bootstrap resamples in
    which its mean is on the front (`pareto_means`' front_share). A second legend says what
    the marks mean."""
    points, means = pareto_points(results), pareto_means(results, settings)
    colors = _colors(results.variants)
    figure, (axes,) = _figure(8.5, 4.5)
    for variant, group in points.groupby("variant", sort=False):
        axes.scatter(group["bias"], group["worst"], s=14, alpha=0.35, color=colors[variant])
    for row in means.itertuples():
        axes.errorbar(
            row.bias_mean,
            row.worst_mean,
            xerr=0 if np.isnan(row.bias_std) else row.bias_std,
            yerr=0 if np.isnan(row.worst_std) else row.worst_std,
            fmt="*" if row.on_front else "o",
            markersize=12 if row.on_front else 8,
            color=colors[row.variant],
            label=display_text(row.variant) + _front_text(row.front_share),
            capsize=3,
        )
    front = means[means["on_front"]].sort_values("bias_mean")
    if len(front) > 1:
        axes.plot(front["bias_mean"], front["worst_mean"], "k--", linewidth=1, alpha=0.6)
    delta = results.primary
    axes.set_xlabel(f"Bias@{delta.symbol} = {delta.value:.4f} (fixed, lower is better)")
    axes.set_ylabel(f"Worst ({results.split}, higher is better)")
    axes.set_title(title or "Utility-fairness operating points (upper-left preferred)")
    figure.legend(title="method", fontsize=7, title_fontsize=8, loc="outside right upper")
    figure.legend(
        handles=_pareto_key(joined=len(front) > 1),
        title="marks",
        fontsize=7,
        title_fontsize=8,
        loc="outside right lower",
    )
    axes.grid(alpha=0.3)
    return figure


def _front_text(share: float) -> str:
    """A method's legend suffix: how often its mean is on the front over seed resamples."""
    return "" if np.isnan(share) else f" (front in {share:.0%} of seed resamples)"


def _pareto_key(joined: bool) -> list:
    """Legend entries explaining the Pareto figure's marks (in grey, for every method); the
    front's line only where it is drawn (`joined`)."""
    from matplotlib.collections import LineCollection
    from matplotlib.container import ErrorbarContainer
    from matplotlib.lines import Line2D

    seed = Line2D([], [], marker="o", linestyle="", markersize=4, alpha=0.35, color="grey")
    seed.set_label("one seed (trial)")
    bar = Line2D([], [], marker="o", linestyle="", markersize=7, color="grey")
    caps = Line2D([], [], marker="|", linestyle="", color="grey")
    bars = [LineCollection([], color="grey") for _ in range(2)]
    mean = ErrorbarContainer((bar, [caps], bars), has_xerr=True, has_yerr=True)
    mean.set_label("mean ± sample std over seeds")
    star = Line2D([], [], marker="*", linestyle="", markersize=10, color="grey")
    star.set_label("mean on the Pareto front")
    line = Line2D([], [], linestyle="--", color="black", alpha=0.6, linewidth=1)
    line.set_label("front (non-dominated means)")
    return [seed, mean, star, line] if joined else [seed, mean, star]


def controller_figure(experiment: Experiment, variant: str) -> Figure:
    """lambda_t and the smoothed violation rate r~_t against the step, one line per seed,
    with r* and the lambda bounds dashed and named with their values in the legends."""
    trials = experiment.trials[experiment.trials["variant"] == variant]
    relif = trials["config"].iloc[0]["relif"]
    figure, (lam_axes, rate_axes) = _figure(10.0, 3.8, columns=2)
    positive = True
    for row in trials.itertuples():
        trace = experiment.trace(row.trial)
        if "lambda" not in trace.columns:
            continue
        positive &= bool((trace["lambda"] > 0).all())
        lam_axes.plot(trace["step"], trace["lambda"], linewidth=1, label=f"seed {row.seed}")
        rate_axes.plot(trace["step"], trace["r_ema"], linewidth=1, label=f"seed {row.seed}")
    bounds = (relif["lambda_min"], relif["lambda_max"])
    for index, bound in enumerate(bounds):
        label = rf"$\lambda$ bounds ({bounds[0]:g}, {bounds[1]:g})" if index == 0 else None
        lam_axes.axhline(bound, color="grey", linestyle=":", linewidth=1, label=label)
    rate_axes.axhline(
        relif["r_star"],
        color="black",
        linestyle="--",
        linewidth=1,
        label=rf"target $r^\star$ = {relif['r_star']:g}",
    )
    if positive:
        lam_axes.set_yscale("log")
    figure.suptitle(display_text(variant))
    lam_axes.set(xlabel="step", ylabel=r"$\lambda_t$", title="penalty weight")
    rate_axes.set(xlabel="step", ylabel=r"$\tilde{r}_t$", title="smoothed violation rate")
    for axes in (lam_axes, rate_axes):
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
    return figure


def rank_shift_figure(results: Results) -> Figure:
    """The paper's headline claim drawn: each method's rank by mean Bias under its own
    method-induced thresholds (left) and under the held-fixed delta_ref (right), joined by a
    line (`relif_ray.analysis.drift_tables.rank_shift`, the shift table's numbers); crossing
    lines are rankings that the method-induced thresholds move. Rank 1 (lowest Bias) is on
    top; each end is labelled "rank. method"."""
    from relif_ray.analysis.drift_tables import rank_shift

    rows = rank_shift(results)
    colors = _colors(results.variants)
    delta = results.primary
    figure, (axes,) = _figure(8.0, 1.4 + 0.4 * len(rows))
    for row in rows.itertuples():
        name, moved = display_text(row.row), row.raw_rank != row.fixed_rank
        axes.plot(
            [0, 1], [row.raw_rank, row.fixed_rank], "-o", color=colors[row.row],
            linewidth=2.5 if moved else 1.2,
        )  # fmt: skip
        for x, rank, side in ((0, row.raw_rank, "right"), (1, row.fixed_rank, "left")):
            axes.annotate(
                f"{rank}. {name}", (x, rank), xytext=(-8 if x == 0 else 8, 0),
                textcoords="offset points", ha=side, va="center", fontsize=8,
            )  # fmt: skip
    axes.set_xticks([0, 1], ["raw: own induced δ_m", f"fixed: {delta.symbol} = {delta.value:.4f}"])
    axes.set_xlim(-1.0, 2.0)
    axes.set_ylim(len(rows) + 0.5, 0.5)
    axes.set_yticks([])
    axes.set_title(f"Rank by mean Bias ({results.split}; 1 = lowest): raw against fixed δ")
    for side in ("left", "right", "top"):
        axes.spines[side].set_visible(False)
    return figure


def sensitivity_figure(results: Results, grid: Sequence[float] | None = None) -> Figure:
    """Mean Bias over seeds against delta (± std band) per method, on a fine grid; the
    held-fixed delta_ref values are marked."""
    grid = np.linspace(0.0, 0.6, 61) if grid is None else np.asarray(grid)
    curves = results.audit.curve(grid, results.split)
    curves = curves.merge(results.per_trial[["trial", "variant"]], on="trial")
    colors = _colors(results.variants)
    figure, (axes,) = _figure(8.5, 4.0)
    for variant in results.variants:
        group = curves[curves["variant"] == variant].groupby("delta")["bias"]
        mean, std = group.mean(), group.std(ddof=1).fillna(0.0)
        axes.plot(mean.index, mean.to_numpy(), color=colors[variant], label=display_text(variant))
        axes.fill_between(mean.index, mean - std, mean + std, color=colors[variant], alpha=0.15)
    for delta, style in zip(results.deltas, itertools.cycle(DELTA_LINE_STYLES), strict=False):
        axes.axvline(
            delta.value,
            color="black",
            linestyle=style,
            linewidth=1,
            label=f"{delta.symbol} = {delta.value:.3f}",
        )
    axes.set(xlabel="δ", ylabel=f"Bias ({results.split})", title="Fixed-delta sensitivity")
    axes.grid(alpha=0.3)
    figure.legend(fontsize=7, loc="outside right upper")
    return figure


def controller_variants(experiment: Experiment) -> list[str]:
    """Variants whose traces carry controller statistics (ReLiF trials)."""
    trials = experiment.trials
    if trials.empty:
        return []
    return list(dict.fromkeys(trials.loc[trials["relif"].astype(bool), "variant"]))


def slug(name: str) -> str:
    """A file-name-safe form of a variant name."""
    kept = "".join(char if char.isalnum() or char in "-+." else "_" for char in name)
    return "_".join(filter(None, kept.split("_")))


def learning_curves_figure(
    experiment: Experiment, metrics: Sequence[str] = (VAL_WORST, VAL_BIAS)
) -> Figure:
    """Per-epoch validation results (Tune's per-epoch records, `Experiment.epochs`, of the
    validated epochs): one panel per metric, the mean over seeds per method against the epoch
    with a ± std band. val_bias is the live audit at the sweep's live delta, not the
    held-fixed delta_ref."""
    epochs = experiment.epochs.merge(experiment.trials[["trial", "variant"]], on="trial")
    if EVALUATED in epochs:  # the validated epochs only (`train.eval_every`)
        epochs = epochs[epochs[EVALUATED].fillna(True).astype(bool)]
    variants = list(dict.fromkeys(experiment.trials["variant"]))
    colors = _colors(variants)
    figure, panels = _figure(4.2 * len(metrics) + 2.5, 3.6, columns=len(metrics))
    for axes, metric in zip(panels, metrics, strict=True):
        for variant in variants:
            group = epochs[epochs["variant"] == variant].groupby("epoch")[metric]
            mean, std = group.mean(), group.std(ddof=1).fillna(0.0)
            if mean.empty:
                continue
            color = colors[variant]
            axes.plot(mean.index, mean.to_numpy(), color=color, label=display_text(variant))
            axes.fill_between(mean.index, mean - std, mean + std, color=color, alpha=0.15)
        axes.set(xlabel="epoch", ylabel=metric, title=metric)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(alpha=0.3)
    handles, labels = panels[0].get_legend_handles_labels()
    figure.legend(handles, labels, fontsize=7, loc="outside right upper")
    figure.suptitle("Learning curves (validation, mean ± std over seeds)")
    return figure


def pair_bias_figure(results: Results, metric: str = "bias") -> Figure:
    """Fixed-delta Bias (or VR) per task pair and method: grouped horizontal bars of the
    mean over seeds (`relif_ray.analysis.breakdown.by_pair`), the aggregate as the last group."""
    from relif_ray.analysis.breakdown import by_pair

    table = by_pair(results, metric)
    colors = _colors(results.variants)
    figure, (axes,) = _figure(8.5, max(3.0, 1.2 + 0.12 * table.size))
    height = 0.8 / len(results.variants)
    positions = np.arange(len(table.index))
    for index, variant in enumerate(results.variants):
        axes.barh(
            positions + index * height,
            table[variant].to_numpy(),
            height=height,
            color=colors[variant],
            label=display_text(variant),
        )
    axes.set_yticks(positions + 0.4 - height / 2, list(table.index))
    axes.invert_yaxis()
    delta = results.primary
    axes.set(
        xlabel=f"{metric.capitalize()}@{delta.symbol} = {delta.value:.4f} ({results.split})",
        title=f"{metric.capitalize()} by task pair (mean over seeds)",
    )
    axes.grid(alpha=0.3, axis="x")
    figure.legend(fontsize=7, loc="outside right upper")
    return figure


def score_distributions_figure(results: Results, bins: int = 20) -> Figure:
    """Histograms (densities) of the audit scores p_k on the shared interface (depth/normal
    squashed as the audit sees them), one panel per task, one line per method, valid examples
    of the report split pooled over seeds."""
    scores = results.audit.scores
    scores = scores[(scores["split"] == results.split) & scores["valid"]]
    scores = scores.merge(results.per_trial[["trial", "variant"]], on="trial")
    tasks = sorted(scores["task"].astype(str).unique())
    colors = _colors(results.variants)
    edges = np.linspace(0.0, 1.0, bins + 1)
    figure, panels = _figure(3.3 * len(tasks) + 2.5, 3.2, columns=len(tasks))
    for axes, task in zip(panels, tasks, strict=True):
        chosen = scores[scores["task"].astype(str) == task]
        for variant in results.variants:
            values = chosen.loc[chosen["variant"] == variant, "score"].to_numpy(np.float64)
            axes.hist(
                values,
                bins=edges,
                density=True,
                histtype="step",
                color=colors[variant],
                label=display_text(variant),
            )
        axes.set(xlabel="audit score", title=task)
        axes.grid(alpha=0.3)
    panels[0].set_ylabel("density")
    handles, labels = panels[0].get_legend_handles_labels()
    figure.legend(handles, labels, fontsize=7, loc="outside right upper")
    figure.suptitle(f"Audit score distributions ({results.split}, pooled over seeds)")
    return figure


def controller_grid(results: Results) -> pd.DataFrame:
    """Per label whose lambda the adaptive controller sets and per (r*, eta) it ran at: the
    mean over seeds of Bias at the primary delta_ref and of Worst, and the seeds: columns
    label, r_star, eta, bias, worst, n_seeds (from each trial's own config)."""
    configs = results.audit.experiment.trials.set_index("trial")["config"]
    per_trial = results.per_trial
    bias = per_trial[f"bias_{results.primary.key}"]
    rows = []
    for trial, label, value, worst in zip(
        per_trial["trial"], per_trial["label"], bias, per_trial["worst"], strict=True
    ):
        relif = configs[trial]["relif"]
        if recorded_controller_adapts(relif):
            rows.append((label, relif["r_star"], relif["eta"], value, worst))
    frame = pd.DataFrame(rows, columns=["label", "r_star", "eta", "bias", "worst"])
    grouped = frame.groupby(["label", "r_star", "eta"], sort=True)
    return grouped.agg(bias=("bias", "mean"), worst=("worst", "mean"), n_seeds=("bias", "size"))


def controller_grid_figure(results: Results) -> Figure:
    """The controller-sensitivity heatmaps: per adaptive ReLiF label (a row), the mean Bias at
    the primary delta_ref (left) and the mean Worst (right) over its (r*, eta) grid, each cell
    annotated with its value and seed count (`controller_grid`; the report's controller table
    has the same means with their spread)."""
    grid = controller_grid(results)
    labels = list(dict.fromkeys(grid.index.get_level_values("label")))
    figure = Figure(figsize=(9.0, 3.2 * max(len(labels), 1)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(max(len(labels), 1), 2, squeeze=False)
    if not labels:
        for ax in axes[0]:
            ax.set_axis_off()
        axes[0][0].text(0, 0.5, "no ReLiF trials with the adaptive controller", fontsize=9)
        return figure
    for row, label in zip(axes, labels, strict=True):
        cells = grid.loc[label]
        for ax, (column, name, cmap) in zip(
            row,
            (
                ("bias", f"Bias@{results.primary.symbol}", "viridis_r"),
                ("worst", "Worst", "viridis"),
            ),
            strict=True,
        ):
            table = cells[column].unstack("eta")
            seeds = cells["n_seeds"].unstack("eta")
            image = ax.imshow(table.to_numpy(dtype=float), cmap=cmap, aspect="auto")
            for (i, j), value in np.ndenumerate(table.to_numpy(dtype=float)):
                if np.isfinite(value):
                    text = f"{value:.3f}\n({int(seeds.iloc[i, j])} seeds)"
                    box = {"facecolor": "white", "alpha": 0.7, "linewidth": 0}
                    ax.text(j, i, text, ha="center", va="center", fontsize=7, bbox=box)
            ax.set_xticks(range(table.shape[1]), [f"{eta:g}" for eta in table.columns])
            ax.set_yticks(range(table.shape[0]), [f"{r:g}" for r in table.index])
            ax.set(xlabel=r"$\eta$", ylabel=r"$r^\star$", title=f"{display_text(label)}: {name}")
            figure.colorbar(image, ax=ax, shrink=0.8)
    return figure


__all__ = [
    "controller_figure",
    "controller_grid",
    "controller_grid_figure",
    "controller_variants",
    "learning_curves_figure",
    "pair_bias_figure",
    "pareto_figure",
    "rank_shift_figure",
    "score_distributions_figure",
    "sensitivity_figure",
]
