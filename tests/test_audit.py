"""Fixed-delta audit (Algorithm 1) and the threshold theory of appendix B."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sklearn.metrics.pairwise import paired_cosine_distances

from relif_ray.audit import (
    AuditGaps,
    AuditSettings,
    audit_gaps,
    bias_curve,
    evaluation_pools,
    fixed_delta_audit,
    sample_pairs,
    scores_frame,
    validate_scores,
)
from relif_ray.audit_bootstrap import bootstrap_bias_ci
from relif_ray.audit_thresholds import (
    conformal_delta,
    delta_from_quantile,
    drift_budget,
    induced_thresholds,
    pair_distances,
    ranking_is_robust,
)
from relif_ray.errors import UserError


def score_table(sizes: dict[str, int], seed: int = 0, invalid: int = 0) -> pd.DataFrame:
    """Scores of several tasks on shared example ids; `invalid` extra rows per task with
    valid == False and score 1.0 (which must never be sampled)."""
    rng = np.random.default_rng(seed)
    parts = []
    for task, n in sizes.items():
        parts.append(
            pd.DataFrame(
                {
                    "task": task,
                    "example_id": np.arange(n),
                    "score": rng.beta(2, 5, n),
                    "valid": True,
                }
            )
        )
        parts.append(
            pd.DataFrame(
                {
                    "task": task,
                    "example_id": np.arange(n, n + invalid),
                    "score": 1.0,
                    "valid": False,
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


def test_audit_matches_a_loop_over_the_sampled_pairs() -> None:
    scores = score_table({"seg": 300, "depth": 200, "normal": 50}, invalid=5)
    frame = validate_scores(scores)
    sampled = sample_pairs(frame, settings=AuditSettings(pool_size=64, pairs=500, pair_seed=42))
    values = frame["score"].tolist()
    delta = 0.1
    result = fixed_delta_audit(scores, delta, settings=AuditSettings(pool_size=64, pairs=500))
    assert set(result.pairs) == {"depth|normal", "depth|seg", "normal|seg"}
    biases, rates = [], []
    for key, (x, y) in sampled.items():
        gaps = [abs(values[i] - values[j]) for i, j in zip(x, y, strict=True)]
        bias = sum(max(g - delta, 0.0) for g in gaps) / len(gaps)
        rate = sum(g > delta for g in gaps) / len(gaps)
        assert result.pairs[key].bias == pytest.approx(bias, abs=1e-12)
        assert result.pairs[key].vr == pytest.approx(rate, abs=1e-12)
        assert result.pairs[key].n == 500
        task_x, task_y = key.split("|")
        assert set(frame["task"].iloc[x]) == {task_x} and set(frame["task"].iloc[y]) == {task_y}
        biases.append(bias)
        rates.append(rate)
    assert result.bias == pytest.approx(np.mean(biases)) and result.vr == pytest.approx(
        np.mean(rates)
    )


def test_pools_are_valid_distinct_and_capped() -> None:
    scores = score_table({"a": 300, "b": 40}, invalid=10)
    frame = validate_scores(scores)
    pools = evaluation_pools(frame, settings=AuditSettings(pool_size=256, eval_seed=3))
    assert len(pools["a"]) == len(set(pools["a"])) == 256
    assert sorted(frame["example_id"].iloc[pools["b"]]) == list(range(40))  # all of a small task
    sampled = sample_pairs(frame, settings=AuditSettings(eval_seed=3))
    x, y = sampled["a|b"]
    assert (frame["score"].iloc[np.concatenate([x, y])] < 1.0).all()  # no invalid row
    assert set(x) <= set(pools["a"]) and set(y) <= set(pools["b"])


def test_pairs_are_drawn_uniformly_with_replacement() -> None:
    scores = score_table({"a": 4, "b": 3})
    x, y = sample_pairs(validate_scores(scores), settings=AuditSettings(pairs=60_000))["a|b"]
    counts = np.bincount(x, minlength=7)[:4]
    assert np.allclose(counts / 60_000, 0.25, atol=0.01)
    joint = pd.crosstab(x, y).to_numpy() / 60_000
    assert np.allclose(joint, 1 / 12, atol=0.006)  # independent draws


def test_result_does_not_depend_on_row_order_task_order_or_other_tasks() -> None:
    scores = score_table({"a": 300, "b": 280, "c": 270})
    base = fixed_delta_audit(scores, 0.2)
    shuffled = scores.sample(frac=1.0, random_state=1)
    assert fixed_delta_audit(shuffled, 0.2) == base
    without_c = fixed_delta_audit(scores[scores["task"] != "c"], 0.2)
    assert without_c.pairs["a|b"] == base.pairs["a|b"]
    renamed = scores.replace({"task": {"c": "0c"}})  # c now sorts first
    assert fixed_delta_audit(renamed, 0.2).pairs["a|b"] == base.pairs["a|b"]


def test_seeds_change_the_sample() -> None:
    scores = score_table({"a": 500, "b": 500})
    base = fixed_delta_audit(scores, 0.1)
    assert fixed_delta_audit(scores, 0.1, settings=AuditSettings(pair_seed=7)) != base
    assert fixed_delta_audit(scores, 0.1, settings=AuditSettings(eval_seed=7)) != base


def test_sampled_audit_estimates_the_all_pairs_expectation() -> None:
    """With pools holding every example, Bias and VR are unbiased for the mean over all
    cross pairs; 40k draws put them within a few standard errors."""
    scores = score_table({"a": 30, "b": 20})
    a = scores.loc[scores["task"] == "a", "score"].to_numpy()
    b = scores.loc[scores["task"] == "b", "score"].to_numpy()
    gaps = np.abs(a[:, None] - b[None, :]).ravel()
    result = fixed_delta_audit(scores, 0.15, settings=AuditSettings(pairs=40_000))
    assert result.bias == pytest.approx(np.maximum(gaps - 0.15, 0).mean(), abs=4 * 0.15 / 200)
    assert result.vr == pytest.approx((gaps > 0.15).mean(), abs=4 * 0.5 / 200)


def test_per_pair_delta() -> None:
    scores = score_table({"a": 100, "b": 100, "c": 100})
    gaps = audit_gaps(scores)
    deltas = {("b", "a"): 0.05, "a|c": 0.5, ("b", "c"): 0.2}
    result = fixed_delta_audit(scores, deltas)
    for key, delta in (("a|b", 0.05), ("a|c", 0.5), ("b|c", 0.2)):
        assert result.pairs[key] == gaps.audit(delta).pairs[key]
    with pytest.raises(UserError, match="b\\|c"):
        fixed_delta_audit(scores, {("a", "b"): 0.1, ("a", "c"): 0.1})


def test_bias_curve_equals_pointwise_audits() -> None:
    gaps = audit_gaps(score_table({"a": 200, "b": 150, "c": 90}))
    grid = np.linspace(0, 1, 41)
    curve = bias_curve(gaps, grid)
    for delta, bias, vr in curve.itertuples(index=False):
        point = gaps.audit(float(delta))
        assert bias == pytest.approx(point.bias, abs=1e-12)
        assert vr == pytest.approx(point.vr, abs=1e-12)
    exact = bias_curve(AuditGaps({"a|b": np.array([0.1, 0.3, 0.3])}), [0.0, 0.3, 0.2])
    np.testing.assert_allclose(exact["bias"], [0.7 / 3, 0.0, 0.2 / 3])
    np.testing.assert_allclose(exact["vr"], [1.0, 0.0, 2 / 3])


gap_arrays = hnp.arrays(np.float64, st.integers(1, 30), elements=st.floats(0, 1))
unit_interval = st.floats(0, 1)


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(gap_arrays, min_size=1, max_size=4),
    first=st.lists(unit_interval, min_size=4, max_size=4),
    second=st.lists(unit_interval, min_size=4, max_size=4),
)
def test_theorem_1_monotone_and_lipschitz_in_delta(gaps, first, second) -> None:
    audit = AuditGaps({f"t{k}|u{k}": g for k, g in enumerate(gaps)})
    keys = list(audit.gaps)
    delta = dict(zip(keys, first, strict=False))
    other = dict(zip(keys, second, strict=False))
    low = {k: min(delta[k], other[k]) for k in keys}
    high = {k: max(delta[k], other[k]) for k in keys}
    at_low, at_high = audit.audit(low), audit.audit(high)
    assert at_high.bias <= at_low.bias + 1e-12 and at_high.vr <= at_low.vr
    budget = drift_budget(delta, other)  # sum_ij w_ij |delta_ij - delta'_ij|, w = 1/#pairs
    assert abs(audit.audit(delta).bias - audit.audit(other).bias) <= budget + 1e-12


@settings(max_examples=60, deadline=None)
@given(
    gaps_a=gap_arrays,
    gaps_b=gap_arrays,
    ref=unit_interval,
    induced_a=unit_interval,
    induced_b=unit_interval,
)
@example(  # a margin one ulp above the budget; the mean of three equal gaps rounds up an ulp
    gaps_a=np.full(3, 0.8676575524464945),
    gaps_b=np.zeros(1),
    ref=0.0,
    induced_a=0.8676575524464945,
    induced_b=0.0,
)
def test_theorem_2_robust_rankings_never_flip(gaps_a, gaps_b, ref, induced_a, induced_b) -> None:
    method_a, method_b = AuditGaps({"x|y": gaps_a}), AuditGaps({"x|y": gaps_b})
    fixed_a, fixed_b = method_a.audit(ref).bias, method_b.audit(ref).bias
    eps_a = drift_budget({"x|y": induced_a}, ref)
    eps_b = drift_budget({"x|y": induced_b}, ref)
    if ranking_is_robust(fixed_a, fixed_b, eps_a, eps_b):
        raw_a, raw_b = method_a.audit(induced_a).bias, method_b.audit(induced_b).bias
        assert (fixed_a > fixed_b) == (raw_a > raw_b)


def test_drift_budget_and_ranking_rule() -> None:
    induced = {"a|b": 0.4, "a|c": 0.2, "b|c": 0.3}
    assert drift_budget(induced, 0.3) == pytest.approx((0.1 + 0.1 + 0.0) / 3)
    weights = {"a|b": 0.5, "a|c": 0.25, "b|c": 0.25}
    assert drift_budget(induced, 0.3, weights) == pytest.approx(0.05 + 0.025)
    assert drift_budget(induced, {"a|b": 0.4, "a|c": 0.2, "b|c": 0.3}) == 0.0
    assert ranking_is_robust(0.30, 0.10, 0.05, 0.05)
    assert not ranking_is_robust(0.30, 0.20, 0.05, 0.05)  # a gap equal to the budget can flip
    assert not ranking_is_robust(0.30, 0.10, 0.1, 0.1 - 1e-12)  # within rounding of it too


def test_delta_from_quantile() -> None:
    values = np.arange(101) / 100
    assert delta_from_quantile(values, 0.75) == pytest.approx(0.75)
    assert delta_from_quantile([0.1, 0.2], 0.5) == pytest.approx(0.15)
    with pytest.raises(UserError):
        delta_from_quantile([0.1, np.nan], 0.5)


def test_conformal_delta_rank_rule() -> None:
    distances = np.linspace(0.01, 0.99, 99)[::-1]
    assert conformal_delta(distances, 0.1) == pytest.approx(np.sort(distances)[89])  # k = 90
    assert conformal_delta(distances[:5], 0.1) == 1.0  # k = ceil(6 * 0.9) = 6 > n
    assert conformal_delta([0.3, 0.1, 0.2], 0.5) == pytest.approx(0.2)  # k = 2


def test_conformal_coverage_holds_empirically() -> None:
    """Theorem B.3: P(D_new > delta) <= (n + 1 - k) / (n + 1) <= alpha; for continuous
    distances the rank argument makes it exactly (n + 1 - k) / (n + 1)."""
    rng = np.random.default_rng(0)
    n, alpha, trials = 19, 0.1, 20_000
    k = math.ceil((n + 1) * (1 - alpha))
    calibration = rng.beta(2, 3, size=(trials, n))
    new = rng.beta(2, 3, size=trials)
    deltas = np.array([conformal_delta(row, alpha) for row in calibration])
    miscoverage = (new > deltas).mean()
    exact = (n + 1 - k) / (n + 1)
    assert exact <= alpha
    assert miscoverage == pytest.approx(exact, abs=4 * math.sqrt(exact * (1 - exact) / trials))


def test_bootstrap_interval_brackets_the_estimate_with_the_normal_width() -> None:
    gaps = audit_gaps(score_table({"a": 300, "b": 300}))
    low, high = bootstrap_bias_ci(gaps, 0.1, n_boot=2000)
    point = gaps.audit(0.1).bias
    assert low < point < high
    hinge = np.maximum(gaps.gaps["a|b"] - 0.1, 0)
    normal_width = 2 * 1.96 * hinge.std() / math.sqrt(hinge.size)
    assert high - low == pytest.approx(normal_width, rel=0.15)


def test_pair_distances_and_induced_thresholds_match_scikit_learn_on_the_audit_pairs() -> None:
    """The reference distances of each audit pair (delta_ref's distribution) and their means,
    the induced thresholds, against scikit-learn's paired cosine distances (1 - cos)."""
    scores = score_table({"a": 40, "b": 30, "c": 20})
    rng = np.random.default_rng(1)
    ids = np.arange(45)[::-1]  # embeddings listed in another order than the scores
    embeddings = rng.normal(size=(45, 6))
    small = AuditSettings(pool_size=16, pairs=300)
    distances = pair_distances(scores, ids, embeddings, settings=small)
    induced = induced_thresholds(scores, ids, embeddings, settings=small)
    frame = validate_scores(scores)
    row_of = {example: row for row, example in enumerate(ids)}
    sampled = sample_pairs(frame, settings=small)
    assert sorted(distances) == sorted(sampled) == ["a|b", "a|c", "b|c"]
    for key, (x, y) in sampled.items():
        u = embeddings[[row_of[e] for e in frame["example_id"].iloc[x]]]
        v = embeddings[[row_of[e] for e in frame["example_id"].iloc[y]]]
        expected = paired_cosine_distances(u, v) / 2
        np.testing.assert_allclose(distances[key], expected, rtol=0, atol=1e-12)
        assert induced[key] == pytest.approx(expected.mean())
    with pytest.raises(UserError, match="example_id"):
        induced_thresholds(scores, ids[:10], embeddings[:10])


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (pd.DataFrame({"task": ["a", "b"]}), "missing column 'score'"),
        (pd.DataFrame({"score": [0.1]}), "missing column 'task'"),
        (pd.DataFrame({"task": ["a", "b"], "score": [0.1, 1.5]}), "in \\[0, 1\\]"),
        (pd.DataFrame({"task": ["a", "b"], "score": [0.1, np.nan]}), "finite"),
        (pd.DataFrame({"task": ["a", "a"], "score": [0.1, 0.2]}), "at least two tasks"),
        (
            pd.DataFrame({"task": ["a", "b"], "score": [0.1, 0.2], "split": ["val", "test"]}),
            "several splits",
        ),
        (
            pd.DataFrame(
                {"task": ["a", "a", "b"], "score": [0.1, 0.2, 0.3], "example_id": [1, 1, 1]}
            ),
            "duplicate",
        ),
        (pd.DataFrame({"task": ["a", "b"], "score": ["x", "y"]}), "numeric"),
    ],
)
def test_bad_tables_raise_one_line_errors(table: pd.DataFrame, message: str) -> None:
    with pytest.raises(UserError, match=message) as error:
        fixed_delta_audit(table, 0.1)
    assert "\n" not in str(error.value)


def test_invalid_rows_may_hold_anything() -> None:
    scores = score_table({"a": 20, "b": 20})
    scores.loc[~scores["valid"], "score"] = np.nan
    extra = pd.DataFrame({"task": ["a"], "example_id": [99], "score": [np.nan], "valid": [False]})
    assert fixed_delta_audit(pd.concat([scores, extra]), 0.1) == fixed_delta_audit(scores, 0.1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"delta": 1.5}, "delta"),
        ({"delta": -0.1}, "delta"),
        ({"delta": 0.1, "settings": AuditSettings(pool_size=0)}, "pool_size"),
        ({"delta": 0.1, "settings": AuditSettings(pairs=-3)}, "pairs"),
        ({"delta": 0.1, "settings": AuditSettings(pair_seed=-1)}, "pair_seed"),
        ({"delta": 0.1, "settings": AuditSettings(eval_seed=1.5)}, "eval_seed"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        fixed_delta_audit(score_table({"a": 5, "b": 5}), **kwargs)


def test_all_pairs_of_many_tasks() -> None:
    tasks = [f"t{k}" for k in range(5)]
    result = fixed_delta_audit(
        score_table(dict.fromkeys(tasks, 10)), 0.2, settings=AuditSettings(pairs=10)
    )
    expected = {f"{a}|{b}" for a, b in itertools.combinations(tasks, 2)}
    assert set(result.pairs) == expected


def test_scores_frame_builds_the_audit_table_of_per_task_arrays():
    """Rows per (task, example), invalid rows kept out of the audit's pools, and Bias at delta
    0.25 = mean (gap - delta)+ over the sampled gaps."""
    frame = scores_frame(
        {"a": np.array([0.1, 0.5, 0.9]), "b": [0.2, 0.95, 0.3]},
        valid={"a": [True, True, True], "b": [True, True, False]},
    )
    assert list(frame.columns) == ["task", "example_id", "score", "valid"]
    assert frame["example_id"].tolist() == [0, 1, 2, 0, 1, 2]
    assert frame["valid"].tolist() == [True] * 5 + [False]
    gaps = audit_gaps(frame, settings=AuditSettings(pairs=6)).gaps["a|b"]
    # every |a - b| of valid scores; b's invalid 0.3 would add the gaps 0.2 and 0.6
    assert set(np.round(gaps, 12)) <= {0.1, 0.85, 0.3, 0.45, 0.7, 0.05}
    audit = fixed_delta_audit(frame, delta=0.25, settings=AuditSettings(pairs=6))
    assert audit.bias == pytest.approx(np.maximum(gaps - 0.25, 0).mean())


def test_bootstrap_intervals_at_several_deltas_are_each_deltas_alone() -> None:
    """One resampling for several deltas (and per-pair thresholds) gives each delta's interval
    of `bootstrap_bias_ci` alone (to float rounding: one matrix product for all)."""
    from relif_ray.audit_bootstrap import bootstrap_bias_cis

    gaps = audit_gaps(score_table({"a": 60, "b": 50, "c": 40}))
    per_pair = {key: 0.05 * (i + 1) for i, key in enumerate(gaps.gaps)}
    deltas = [0.1, 0.3, per_pair, 0.0]
    together = bootstrap_bias_cis(gaps, deltas, n_boot=300, seed=4)
    alone = [bootstrap_bias_ci(gaps, d, n_boot=300, seed=4) for d in deltas]
    assert np.array(together) == pytest.approx(np.array(alone), rel=1e-12, abs=1e-15)
    assert together[0][0] > together[1][1]  # a larger delta: a lower Bias


def test_bootstrap_interval_is_the_percentile_interval_of_resampled_pairs() -> None:
    """The definition, computed directly: per replicate, each task pair's S gaps drawn with
    replacement (the generator at `seed`, the pairs in order), the mean hinge over them, the
    mean over task pairs; the interval is the replicates' 2.5% and 97.5% quantiles."""
    gaps = audit_gaps(score_table({"a": 70, "b": 40, "c": 30}))
    rng = np.random.default_rng(7)
    replicates = np.zeros(500)
    for values in gaps.gaps.values():
        drawn = values[rng.integers(0, values.size, size=(500, values.size))]
        replicates += np.maximum(drawn - 0.2, 0.0).mean(axis=1)
    expected = np.quantile(replicates / len(gaps.gaps), [0.025, 0.975])
    assert bootstrap_bias_ci(gaps, 0.2, n_boot=500, seed=7) == pytest.approx(
        tuple(expected), rel=1e-12
    )


def test_a_batch_of_requests_gives_each_request_alone() -> None:
    """Requests with the same strata sizes share their draws, one with other sizes draws its
    own: each result is `bootstrap_bias_cis` of that request alone."""
    from relif_ray.audit_bootstrap import bootstrap_bias_cis, bootstrap_bias_cis_batch

    same = [audit_gaps(score_table({"a": 60, "b": 50}, seed=s)) for s in (0, 1)]
    other = audit_gaps(score_table({"a": 30, "b": 20, "c": 25}))
    requests = [(same[0], [0.1, 0.2]), (other, [0.05]), (same[1], [0.3])]
    batch = bootstrap_bias_cis_batch(requests, n_boot=400, seed=2)
    for (gaps, deltas), found in zip(requests, batch, strict=True):
        alone = bootstrap_bias_cis(gaps, deltas, n_boot=400, seed=2)
        assert np.array(found) == pytest.approx(np.array(alone), rel=1e-12, abs=1e-15)
    assert batch[0][0] != batch[2][0]  # the same draws, other gaps: other intervals
