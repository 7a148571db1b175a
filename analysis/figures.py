"""Figures: Pareto fronts (paper Figure 2), controller traces, delta-sensitivity curves.

Figures are built on `matplotlib.figure.Figure` with the Agg canvas, so writing PNGs needs no
display and changes no global pyplot state; in Jupyter the returned figures display inline.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.experiment import Experiment
from analysis.pareto import pareto_means, pareto_points
from analysis.render import display_text
from analysis.results import Results

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


def pareto_figure(results: Results, title: str | None = None) -> Figure:
    """Per-seed points (small dots), per-method means with ± std bars (large markers), and the
    non-dominated means joined by a dashed line; x = fixed-delta Bias, y = Worst. A second
    legend says what the marks mean."""
    points, means = pareto_points(results), pareto_means(results)
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
            label=display_text(row.variant) + (" (front)" if row.on_front else ""),
            capsize=3,
        )
    front = means[means["on_front"]].sort_values("bias_mean")
    axes.plot(front["bias_mean"], front["worst_mean"], "k--", linewidth=1, alpha=0.6)
    delta = results.primary
    axes.set_xlabel(f"Bias@{delta.symbol} = {delta.value:.4f} (fixed, lower is better)")
    axes.set_ylabel(f"Worst ({results.split}, higher is better)")
    axes.set_title(title or "Utility-fairness operating points (upper-left preferred)")
    figure.legend(title="method", fontsize=7, title_fontsize=8, loc="outside right upper")
    figure.legend(
        handles=_pareto_key(),
        title="marks",
        fontsize=7,
        title_fontsize=8,
        loc="outside right lower",
    )
    axes.grid(alpha=0.3)
    return figure


def _pareto_key() -> list:
    """Legend entries explaining the Pareto figure's marks (in grey, for every method)."""
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
    return [seed, mean, star, line]


def controller_figure(experiment: Experiment, variant: str) -> Figure:
    """lambda_t and the smoothed violation rate r~_t against the step, one line per seed,
    with r* and the lambda bounds dashed."""
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
    for bound in (relif["lambda_min"], relif["lambda_max"]):
        lam_axes.axhline(bound, color="grey", linestyle=":", linewidth=1)
    rate_axes.axhline(
        relif["r_star"], color="black", linestyle="--", linewidth=1, label=r"$r^\star$"
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
