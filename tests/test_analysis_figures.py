"""Readable figures: no two text labels overlap and none is cut off, in every figure the report
and the notebook draw; the Pareto legend explains its marks; per-pair Bias and learning curves
hold the audited numbers."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from relif_ray import analysis
from relif_ray.analysis.breakdown import OVERALL, by_pair, pair_audits
from relif_ray.analysis.drift_tables import shift_table
from relif_ray.analysis.figures import (
    _figure,
    controller_figure,
    controller_variants,
    learning_curves_figure,
    pair_bias_figure,
    pareto_figure,
    rank_shift_figure,
    score_distributions_figure,
    sensitivity_figure,
)
from relif_ray.analysis.render import display_text
from relif_ray.analysis.tables import CISettings
from relif_ray.audit import fixed_delta_audit
from relif_ray.testing.synthetic_experiment import write_synthetic_experiment
from tests.test_analysis import SETTINGS, squashed_scores, stored_trials


@pytest.fixture(scope="module")
def experiment_dir(tmp_path_factory) -> Path:
    """Many variants with long names: PCGrad+ReLiF and ReLiF at three controller settings."""
    return write_synthetic_experiment(
        tmp_path_factory.mktemp("figures") / "exp",
        labels=("erm", "pcgrad", "relif", "pcgrad+relif", "relif-noalign"),
        seeds=3,
        n_examples=30,
        splits=("val", "test"),
        controller_grid=((0.28, 1e-3), (0.2, 1e-3), (0.24, 1e-2)),
        trace_steps=30,
    )


@pytest.fixture(scope="module")
def experiment(experiment_dir):
    return analysis.load(experiment_dir)


@pytest.fixture(scope="module")
def results(experiment):
    return analysis.audit(experiment, ["erm:p75", "erm:p50"], settings=SETTINGS)


def drawn_texts(figure: Figure) -> list[Text]:
    """The non-empty text artists a draw puts on the canvas: tick labels only of ticks inside
    the axis' view interval (matplotlib keeps, but does not draw, the others)."""
    figure.canvas.draw()
    tick_labels, shown = set(), []
    for axes in figure.axes:
        for axis in (axes.xaxis, axes.yaxis):
            low, high = sorted(axis.get_view_interval())
            margin = 1e-9 * max(1.0, abs(high - low))
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                labels = (tick.label1, tick.label2)
                tick_labels.update(id(label) for label in labels)
                if low - margin <= tick.get_loc() <= high + margin:
                    shown += [label for label in labels if label.get_visible()]
    others = [t for t in figure.findobj(Text) if id(t) not in tick_labels and t.get_visible()]
    return [t for t in shown + others if t.get_text().strip()]


def overlapping_texts(figure: Figure) -> list[tuple[str, str]]:
    """Pairs of drawn texts whose window extents overlap, and texts cut off by the edge."""
    renderer = figure.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in drawn_texts(figure)]
    problems = [
        (a, b)
        for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2)
        if box_a.overlaps(box_b)
    ]
    edge = figure.bbox.padded(1.0)
    problems += [
        (text, "figure edge")
        for text, box in boxes
        if not all(edge.contains(x, y) for x, y in box.corners())
    ]
    return problems


def test_the_overlap_check_finds_overlapping_and_cut_off_labels():
    figure, (axes,) = _figure(4.0, 3.0)
    axes.set_title("a title")
    assert overlapping_texts(figure) == []
    axes.text(0.5, 0.5, "first label")
    axes.text(0.52, 0.5, "second label")
    axes.text(1.6, 0.5, "outside")
    problems = overlapping_texts(figure)
    assert ("first label", "second label") in problems
    assert ("outside", "figure edge") in problems


def all_figures(experiment, results) -> dict[str, Figure]:
    figures = {
        "pareto": pareto_figure(results),
        "delta_sensitivity": sensitivity_figure(results),
        "learning_curves": learning_curves_figure(experiment),
        "pair_bias": pair_bias_figure(results),
        "score_distributions": score_distributions_figure(results),
        "rank_shift": rank_shift_figure(results),
    }
    for variant in controller_variants(experiment):
        figures[f"controller {variant}"] = controller_figure(experiment, variant)
    return figures


@pytest.mark.slow
def test_no_two_labels_overlap_in_any_figure(experiment, results):
    figures = all_figures(experiment, results)
    assert len(figures) == 6 + 9
    for name, figure in figures.items():
        assert overlapping_texts(figure) == [], name


def test_rank_shift_figure_draws_the_shift_tables_ranks(results):
    """One line per method from its raw rank (own induced thresholds, x = 0) to its fixed-delta
    rank (x = 1): the ranks of the shift table, rank 1 at the top."""
    table = shift_table(results, CISettings(n_boot=0)).rows.set_index("row")
    figure = rank_shift_figure(results)
    (axes,) = figure.axes
    drawn = {}
    for line, left, right in zip(axes.get_lines(), axes.texts[::2], axes.texts[1::2], strict=True):
        assert list(line.get_xdata()) == [0, 1]
        ranks = tuple(int(y) for y in line.get_ydata())
        name = left.get_text().split(". ", 1)[1]
        assert (
            left.get_text() == f"{ranks[0]}. {name}" and right.get_text() == f"{ranks[1]}. {name}"
        )
        drawn[name] = ranks
    expected = {
        display_text(variant): (row.raw_rank, row.fixed_rank) for variant, row in table.iterrows()
    }
    assert drawn == expected
    assert set(table["shift"]) == {f"{a}→{b}" for a, b in expected.values()}
    bottom, top = axes.get_ylim()
    assert top < bottom  # rank 1 on top


def test_pareto_legend_explains_the_marks_and_each_front_share(results):
    """The key names every mark, the front's line only where two or more means are joined;
    each method's entry gives the share of seed resamples with its mean on the front."""
    texts = {t.get_text() for t in drawn_texts(pareto_figure(results))}
    assert {"one seed (trial)", "mean ± sample std over seeds", "mean on the Pareto front"} <= texts
    means = analysis.pareto_means(results)
    assert ("front (non-dominated means)" in texts) == (means["on_front"].sum() > 1)
    assert means["front_share"].between(0, 1).all()
    for row in means.itertuples():
        share = f"(front in {row.front_share:.0%} of seed resamples)"
        assert f"{display_text(row.variant)} {share}" in texts
    assert any(text.startswith("PCGrad+ReLiF (r*=0.2, eta=0.001) (front") for text in texts)


def test_the_controller_figure_names_the_lambda_bounds_and_r_star(experiment):
    variant = controller_variants(experiment)[0]
    relif = experiment.trials.loc[experiment.trials["variant"] == variant, "config"].iloc[0]
    relif = relif["relif"]
    texts = {t.get_text() for t in drawn_texts(controller_figure(experiment, variant))}
    assert f"$\\lambda$ bounds ({relif['lambda_min']:g}, {relif['lambda_max']:g})" in texts
    assert f"target $r^\\star$ = {relif['r_star']:g}" in texts


def test_delta_refs_are_named_in_the_legend(results):
    texts = {t.get_text() for t in drawn_texts(sensitivity_figure(results))}
    for delta in results.deltas:
        assert f"{delta.symbol} = {delta.value:.3f}" in texts


def test_per_pair_bias_equals_the_audit_of_each_pair(experiment_dir, results):
    stored = stored_trials(experiment_dir)
    delta = results.primary.value
    audits = pair_audits(results)
    for trial in list(stored)[:4]:
        expected = fixed_delta_audit(
            squashed_scores(stored, trial, "test"), delta, settings=SETTINGS
        )
        rows = audits[audits["trial"] == trial].set_index("pair")
        assert set(rows.index) == set(expected.pairs) == {"depth|normal", "depth|seg", "normal|seg"}
        for pair, audit in expected.pairs.items():
            assert rows.loc[pair, "bias"] == pytest.approx(audit.bias, abs=1e-12)
            assert rows.loc[pair, "vr"] == pytest.approx(audit.vr, abs=1e-12)


def test_by_pair_overall_row_is_the_aggregate_bias(results):
    table = by_pair(results)
    assert list(table.columns) == results.variants
    assert list(table.index) == ["depth|normal", "depth|seg", "normal|seg", OVERALL]
    key = f"bias_{results.primary.key}"
    aggregate = results.per_trial.groupby("variant", sort=False)[key].mean()
    np.testing.assert_allclose(table.loc[OVERALL], aggregate[results.variants], atol=1e-12)
    np.testing.assert_allclose(table.drop(OVERALL).mean(), aggregate[results.variants], atol=1e-12)


def test_learning_curves_are_the_seed_means_of_the_recorded_epochs(experiment_dir, experiment):
    figure = learning_curves_figure(experiment, ["val_worst"])
    line = next(line for line in figure.axes[0].get_lines() if line.get_label() == "ERM")
    records = []
    for folder in sorted(experiment_dir.iterdir()):
        frame = pd.read_json(folder / "result.json", lines=True)
        if frame["label"].iloc[0] == "erm":
            records.append(frame.set_index("epoch")["val_worst"])
    expected = pd.concat(records, axis=1).mean(axis=1)
    np.testing.assert_allclose(line.get_xdata(), expected.index)
    np.testing.assert_allclose(line.get_ydata(), expected.to_numpy(), atol=1e-12)


def test_close_delta_refs_do_not_overprint(experiment):
    close = analysis.audit(experiment, [0.3, 0.305], settings=SETTINGS)
    assert overlapping_texts(sensitivity_figure(close)) == []
