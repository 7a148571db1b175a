"""The paper's tables, Pareto fronts, the Theorem B.2 certificate and `relif report`.

Every table number is compared with a direct recomputation from the generated trial output
folders (helpers in tests/test_analysis.py), using `relif_ray.audit` and numpy only.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from relif_ray import analysis
from relif_ray.analysis import delta as delta_options
from relif_ray.analysis.delta import DeltaRef
from relif_ray.analysis.drift_tables import certificate_table, drift_table, shift_table
from relif_ray.analysis.experiment_audit import ExperimentAudit
from relif_ray.analysis.paired import null_value
from relif_ray.analysis.relif_tables import ablation_table, controller_table
from relif_ray.analysis.render import Column, Table, bound_text, margin_text
from relif_ray.analysis.results import Results, compute_results
from relif_ray.analysis.tables import (
    CISettings,
    Skipped,
    main_table,
    saturation_table,
    sensitivity_table,
    violation_table,
)
from relif_ray.audit import fixed_delta_audit
from relif_ray.audit_thresholds import induced_thresholds
from relif_ray.cli import main
from relif_ray.sweep.selection import non_dominated
from relif_ray.testing.synthetic_experiment import write_synthetic_experiment
from tests.test_analysis import SETTINGS, squashed_scores, stored_trials

NO_CI = CISettings(n_boot=0)
AUDIT_FLAGS = ["--pool-size", "16", "--pairs", "256"]


@pytest.fixture(scope="module")
def experiment_dir(tmp_path_factory) -> Path:
    """NYUv2-shaped: ERM, PCGrad, ReLiF at two controller settings, three ablations."""
    return write_synthetic_experiment(
        tmp_path_factory.mktemp("report") / "exp",
        labels=("erm", "pcgrad", "relif", "relif-noalign", "relif-static", "relif-nolip"),
        seeds=3,
        n_examples=30,
        splits=("val", "test"),
        controller_grid=((0.24, 1e-3), (0.16, 0.5)),
        trace_steps=40,
        errored=1,
    )


@pytest.fixture(scope="module")
def stored(experiment_dir):
    return stored_trials(experiment_dir)


@pytest.fixture(scope="module")
def results(experiment_dir) -> Results:
    audit = ExperimentAudit(analysis.load(experiment_dir), SETTINGS)
    deltas = [
        delta_options.resolve(delta_options.fixed("0.3"), audit),
        delta_options.resolve(delta_options.quantile("erm:p75"), audit),
    ]
    return compute_results(audit, deltas, "test")


def direct_per_trial(stored, results: Results) -> pd.DataFrame:
    """Per trial, recomputed from the files: variant, utility, Bias/VR at each delta_ref,
    Bias at the sensitivity deltas, mean induced threshold and raw Bias."""
    variants = dict(zip(results.per_trial["trial"], results.per_trial["variant"], strict=True))
    rows = []
    for trial, record in stored.items():
        scores = squashed_scores(stored, trial, "test")
        metrics = record.info["metrics"]["test"]
        row = {
            "trial": trial,
            "variant": variants[trial],
            "worst": metrics["worst"],
            "macro": metrics["macro"],
            "depth_rmse": metrics["depth_rmse"],
        }
        for delta in results.deltas:
            audit = fixed_delta_audit(scores, delta.value, settings=SETTINGS)
            row[f"bias_{delta.key}"], row[f"vr_{delta.key}"] = audit.bias, audit.vr
        for delta in results.sensitivity:
            row[f"bias_at_{delta:g}"] = fixed_delta_audit(scores, delta, settings=SETTINGS).bias
        ids, matrix = record.representations("val")
        induced = induced_thresholds(
            squashed_scores(stored, trial, "val"), ids, matrix, settings=SETTINGS
        )
        row["induced_mean"] = np.mean(list(induced.values()))
        row["raw_bias"] = fixed_delta_audit(scores, induced, settings=SETTINGS).bias
        row["drift"] = np.mean([abs(v - results.primary.value) for v in induced.values()])
        rows.append(row)
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def direct(stored, results) -> pd.DataFrame:
    return direct_per_trial(stored, results)


def assert_stat_columns(table: Table, direct: pd.DataFrame, keys: list[str]) -> None:
    """Each `<key>_mean` / `<key>_std` equals the mean / sample std over the variant's seeds."""
    expected = direct.groupby("variant")[keys].agg(["mean", "std"])
    for _, row in table.rows.iterrows():
        for key in keys:
            mean, std = row[f"{key}_mean"], row[f"{key}_std"]
            assert mean == pytest.approx(expected.loc[row["row"], (key, "mean")], abs=1e-12), key
            assert std == pytest.approx(expected.loc[row["row"], (key, "std")], abs=1e-12), key


# --- tables equal a direct recomputation ---------------------------------------------------


def test_main_table(results, direct):
    table = main_table(results, NO_CI)
    keys = ["worst", "macro", "depth_rmse", "bias_0.3", "bias_p75"]
    assert_stat_columns(table, direct, keys)
    assert list(table.rows["row"]) == list(dict.fromkeys(results.per_trial["variant"]))
    assert (table.rows["n_seeds"] == 3).all()
    headers = [c.header for c in table.columns][-3:]
    assert headers == ["Bias@δ=0.3", "Bias@δ_p75", "Saturated"]


def test_saturation_shares_and_the_flag(stored, results) -> None:
    """Shares of valid audit scores at 0 / at 1 recomputed from the files with the same-seed
    ERM squash; a method is flagged when its largest share exceeds same-seed ERM's by more
    than 0.2 (mean over seeds)."""
    per_trial = results.per_trial.set_index("trial")
    erm_of = {}
    for trial, record in stored.items():
        scores = squashed_scores(stored, trial, "test")
        scores = scores[scores["valid"]]
        for task in ("depth", "normal"):
            values = scores.loc[scores["task"] == task, "score"]
            assert per_trial.loc[trial, f"clip0_{task}"] == (values <= 0).mean()
            assert per_trial.loc[trial, f"clip1_{task}"] == (values >= 1).mean()
        if record.is_erm:
            erm_of[record.seed] = trial
    columns = [f"{b}_{t}" for b in ("clip0", "clip1") for t in ("depth", "normal")]
    excess = {
        trial: float(
            (per_trial.loc[trial, columns] - per_trial.loc[erm_of[record.seed], columns]).max()
        )
        for trial, record in stored.items()
    }
    assert per_trial["saturation_excess"].to_dict() == pytest.approx(excess, abs=1e-12)
    table = main_table(results, NO_CI).rows.set_index("row")
    for variant, trials in results.per_trial.groupby("variant")["trial"]:
        mean = np.mean([excess[t] for t in trials])
        expected = f"yes (+{mean:.2f})" if mean > 0.2 else ""
        assert table.loc[variant, "saturated"] == expected
    assert table.loc["erm", "saturated"] == ""  # zero excess over itself
    shares = saturation_table(results).rows.set_index("row")
    assert shares.loc["erm", "clip1_depth_mean"] == pytest.approx(
        per_trial.loc[list(erm_of.values()), "clip1_depth"].mean(), abs=1e-12
    )


def test_violation_table(results, direct):
    assert_stat_columns(violation_table(results), direct, ["vr_0.3", "vr_p75"])


def test_drift_table(results, direct):
    table = drift_table(results, "pcgrad")
    assert_stat_columns(table, direct, ["induced_mean"])
    means = direct.groupby("variant")["induced_mean"].mean()
    for row in table.rows.itertuples():
        assert row.difference == pytest.approx(means[row.row] - means["pcgrad"], abs=1e-12)
        assert row.ratio == pytest.approx(means[row.row] / means["pcgrad"], rel=1e-12)


def test_shift_table_ranks_raw_and_fixed_bias(results, direct):
    table = shift_table(results, NO_CI)
    assert_stat_columns(table, direct, ["raw_bias", "bias_0.3"])
    raw = direct.groupby("variant")["raw_bias"].mean().rank(method="min")
    fixed = direct.groupby("variant")["bias_0.3"].mean().rank(method="min")
    for row in table.rows.itertuples():
        assert row.shift == f"{int(raw[row.row])}→{int(fixed[row.row])}"


def test_sensitivity_table(results, direct):
    keys = [f"bias_at_{d:g}" for d in (0.15, 0.2, 0.275, 0.35, 0.45)]
    table = sensitivity_table(results, NO_CI)
    assert_stat_columns(table, direct, keys)
    means = table.rows[[f"{k}_mean" for k in keys]].to_numpy()
    assert (np.diff(means, axis=1) <= 0).all()  # Bias is non-increasing in delta (Thm B.1)


def test_ablation_table_lists_relif_variants_with_their_components(results, direct):
    table = ablation_table(results, results.audit.experiment, NO_CI)
    assert_stat_columns(table, direct, ["worst", "macro", "bias_0.3"])
    components = {
        row.row.split(" (")[0]: (row.quantile_alignment, row.controller, row.lipschitz_branch)
        for row in table.rows.itertuples()
    }
    assert components == {
        "relif": ("on", "adaptive", "on"),
        "relif-noalign": ("off", "adaptive", "on"),
        "relif-static": ("on", "static", "on"),
        "relif-nolip": ("on", "adaptive", "off"),
    }


def test_controller_table_counts_steps_at_a_lambda_bound(results, direct, stored):
    table = controller_table(results, results.audit.experiment, NO_CI)
    rows = {row.split(" (")[0] for row in table.rows["row"]}
    assert rows == {"relif", "relif-noalign", "relif-static"}  # static lambda: its lambda0
    shares = []
    for trial, record in stored.items():
        relif = record.info["config"]["relif"]
        if not relif["enabled"] or not relif["lipschitz_branch"]:
            continue
        lam = record.trace()["lambda"].to_numpy()
        shares.append(
            {
                "trial": trial,
                "at_lower": np.mean(np.abs(lam - 0.01) < 1e-9),
                "at_upper": np.mean(np.abs(lam - 1.0) < 1e-9),
            }
        )
    expected = direct.merge(pd.DataFrame(shares), on="trial")
    assert_stat_columns(table, expected, ["worst", "bias_0.3", "at_lower", "at_upper"])
    assert table.rows["at_upper_mean"].max() > 0  # eta = 0.5 reaches lambda_max
    eta = dict(zip(table.rows["row"], table.rows["eta"], strict=True))
    assert eta["relif (r*=0.16, eta=0.5)"] == "0.5"


def test_tables_without_data_are_skipped(tmp_path):
    root = write_synthetic_experiment(tmp_path / "plain", labels=("erm", "pcgrad"), seeds=2)
    audit = ExperimentAudit(analysis.load(root), SETTINGS)
    results = compute_results(
        audit, [delta_options.resolve(delta_options.fixed("0.2"), audit)], "val"
    )
    experiment = audit.experiment
    assert isinstance(ablation_table(results, experiment, NO_CI), Skipped)
    assert isinstance(controller_table(results, experiment, NO_CI), Skipped)


def test_delta_refs_of_equal_value_each_get_one_bias_per_trial(tmp_path):
    """ERM's p75 and p50 coincide on a degenerate reference distribution (e.g. a validation
    split of two examples): each delta_ref still gets exactly one Bias and VR per trial."""
    root = write_synthetic_experiment(tmp_path / "plain", labels=("erm", "pcgrad"), seeds=2)
    audit = ExperimentAudit(analysis.load(root), SETTINGS)
    first = delta_options.resolve(delta_options.fixed("0.2"), audit)
    second = dataclasses.replace(first, key="same", symbol="δ_same")
    per_trial = compute_results(audit, [first, second], "val").per_trial
    assert len(per_trial) == len(audit.experiment.trials) == 4
    assert per_trial[f"bias_{first.key}"].tolist() == per_trial["bias_same"].tolist()
    assert per_trial[f"vr_{first.key}"].tolist() == per_trial["vr_same"].tolist()


def test_bias_interval_matches_the_analytic_standard_error(results, direct):
    """The bootstrap interval of a seed mean ~ mean +- 1.96 SE, SE^2 = sum_k var_k / S / K^2
    over the K (trial, task pair) strata of S hinge values each."""
    trials = list(results.per_trial.loc[results.per_trial["variant"] == "pcgrad", "trial"])
    low, high = results.bias_ci(trials, 0.3, n_boot=4000, level=0.95)
    hinges = [
        np.maximum(values - 0.3, 0)
        for trial in trials
        for values in results.audit.gaps("test")[trial].gaps.values()
    ]
    mean = np.mean([h.mean() for h in hinges])
    se = np.sqrt(sum(h.var() / h.size for h in hinges)) / len(hinges)
    assert low < mean < high
    assert (high - low) / (2 * 1.96 * se) == pytest.approx(1.0, abs=0.1)
    assert mean == pytest.approx(direct.groupby("variant")["bias_0.3"].mean()["pcgrad"])


# --- Theorem B.2 certificate -------------------------------------------------------------


def constructed_results(biases: dict, drifts: dict, raws: dict) -> Results:
    per_trial = pd.DataFrame(
        {
            "variant": list(biases),
            "bias_ref": list(biases.values()),
            "drift": [drifts[v] for v in biases],
            "raw_bias": [raws[v] for v in biases],
        }
    )
    delta = DeltaRef(0.3, "ref", "δ_ref", r"\delta_{ref}", "given")
    return Results(per_trial, pd.DataFrame(), [delta], [], "val", [], list(biases), None)


@pytest.mark.parametrize(
    ("bias_b", "eps", "robust"),
    [(0.10, 0.05, "yes"), (0.26, 0.05, "no"), (0.20, 0.05, "no")],
)
def test_certificate_on_constructed_cases(bias_b, eps, robust):
    """|B_A - B_B| = 0.3 - bias_b against eps_A + eps_B = 2 eps; equality is not enough."""
    results = constructed_results(
        {"A": 0.30, "B": bias_b}, {"A": eps, "B": eps}, {"A": 0.2, "B": 0.1}
    )
    row = certificate_table(results).rows.iloc[0]
    assert row["robust"] == robust
    assert row["margin"] == pytest.approx(abs(0.30 - bias_b) - 2 * eps)


def test_certificate_flags_a_flipped_raw_order():
    results = constructed_results(
        {"A": 0.30, "B": 0.28}, {"A": 0.05, "B": 0.05}, {"A": 0.10, "B": 0.20}
    )
    row = certificate_table(results).rows.iloc[0]
    assert (row["robust"], row["flipped"]) == ("no", "yes")


def test_certificate_agrees_with_theorem_b2_on_audited_trials(results, direct):
    """Raw and fixed seed-mean gaps differ by at most eps_A + eps_B; a flip needs no cert."""
    table = certificate_table(results)
    means = direct.groupby("variant")[["bias_0.3", "raw_bias", "drift"]].mean()
    assert len(table.rows) == len(results.variants) * (len(results.variants) - 1) // 2
    for row in table.rows.itertuples():
        a, b = row.row.split(" vs ")
        fixed_gap = means.loc[a, "bias_0.3"] - means.loc[b, "bias_0.3"]
        raw_gap = means.loc[a, "raw_bias"] - means.loc[b, "raw_bias"]
        budget = means.loc[a, "drift"] + means.loc[b, "drift"]
        assert row.eps_a + row.eps_b == pytest.approx(budget, abs=1e-12)
        assert abs(raw_gap - fixed_gap) <= budget + 1e-12
        assert row.robust == ("yes" if abs(fixed_gap) > budget else "no")
        assert not (row.robust == "yes" and row.flipped == "yes")


# --- rendering and Pareto fronts -----------------------------------------------------------


def test_markdown_and_latex_mark_best_bold_and_second_underlined():
    rows = pd.DataFrame(
        {
            "row": ["a_1", "b&c", "d"],
            "n_seeds": [3, 3, 1],
            "worst_mean": [0.5, 0.7, 0.6],
            "worst_std": [0.01, 0.02, np.nan],
            "bias_mean": [0.2, 0.1, 0.1],
            "bias_std": [0.01, 0.01, 0.01],
        }
    )
    table = Table(
        "t",
        "A & B",
        "Method",
        [Column("worst", "Worst", "Worst", "higher"), Column("bias", "Bias", "Bias", "lower")],
        rows,
    )
    markdown = table.markdown().splitlines()
    assert markdown[2] == "| a_1 | 0.5000 ± 0.0100 | <u>0.2000 ± 0.0100</u> |"
    assert markdown[3] == "| b&c | **0.7000 ± 0.0200** | **0.1000 ± 0.0100** |"
    assert markdown[4] == "| d | <u>0.6000</u> | **0.1000 ± 0.0100** |"
    latex = table.latex()
    assert r"a\_1 & $0.5000\pm0.0100$ & $\underline{0.2000\pm0.0100}$ \\" in latex
    assert r"b\&c & $\mathbf{0.7000\pm0.0200}$ & $\mathbf{0.1000\pm0.0100}$ \\" in latex
    assert r"\toprule" in latex and r"\bottomrule" in latex and r"\caption{A \& B}" in latex
    assert list(table.csv_frame().columns)[:2] == ["method", "n_seeds"]


@pytest.mark.parametrize(
    ("value", "null", "digits", "sign", "text"),
    [
        (1.0024944, 1.0, 2, False, "1.0025"),  # ACTG 175's FairGrad Bias ratio, lower bound
        (0.99961, 1.0, 2, False, "0.99961"),
        (1.0312, 1.0, 2, False, "1.03"),  # off the null value: as many digits as asked
        (-0.0004, 0.0, 3, True, "-0.00040"),
        (0.00049, 0.0, 3, True, "+0.00049"),
        (0.0005, 0.0, 3, True, "+0.001"),
        (1.0, 1.0, 2, False, "1.00"),  # on the null value: no side to show
        (math.nan, 1.0, 2, False, "–"),
    ],
)
def test_a_bound_is_printed_on_its_side_of_the_null_value(value, null, digits, sign, text):
    assert bound_text(value, null, digits, sign) == text


def test_the_equivalence_bound_is_rounded_up_to_two_digits():
    assert [margin_text(m) for m in (0.00412, 0.0042, 0.0123, 0.9, 1.2566)] == [
        "0.0042", "0.0042", "0.013", "0.90", "1.3",
    ]  # fmt: skip


def test_the_paired_tables_bounds_agree_with_their_verdicts():
    """A ratio's interval [1.0025, 1.04] is printed so (higher than 1), a difference's upper
    bound -0.00004 as below 0, in Markdown and LaTeX; other cells keep their 4 decimals."""
    rows = pd.DataFrame(
        {
            "row": ["fairgrad", "uncertainty"],
            "scale": ["log ratio", "difference"],
            "ci_low": [1.0024944, -0.0021],
            "ci_high": [1.0381, -0.00004],
        }
    )
    columns = [
        Column("ci_low", "CI low", "CI low", kind="number", null=null_value),
        Column("ci_high", "CI high", "CI high", kind="number", null=null_value),
    ]
    table = Table("t", "t", "Method", columns, rows)
    assert table.markdown().splitlines()[2:] == [
        "| FairGrad | 1.0025 | 1.0381 |",
        "| Uncertainty | -0.0021 | -0.000040 |",
    ]
    assert r"FairGrad & $1.0025$ & $1.0381$ \\" in table.latex()


def test_two_rows_get_a_bold_best_and_no_second():
    rows = pd.DataFrame(
        {"row": ["a", "b"], "n_seeds": [2, 2], "x_mean": [0.1, 0.2], "x_std": [0.0, 0.0]}
    )
    table = Table("t", "t", "Method", [Column("x", "X", "X", "lower")], rows)
    assert table.marks(table.columns[0]) == ["best", ""]


def brute_force_front(points: np.ndarray) -> set[int]:
    front = set()
    for i, (bias, worst) in enumerate(points):
        dominated = any(
            b <= bias and w >= worst and (b < bias or w > worst)
            for j, (b, w) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.add(i)
    return front


@pytest.mark.parametrize("seed", range(5))
def test_pareto_front_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    points = rng.integers(0, 6, size=(40, 2)) / 5  # many ties and duplicates
    mask = non_dominated(points[:, 0], points[:, 1])
    assert set(np.flatnonzero(mask)) == brute_force_front(points)


def test_pareto_means_and_points_use_the_primary_bias(results, direct):
    means = analysis.pareto_means(results).set_index("variant")
    expected = direct.groupby("variant")[["bias_0.3", "worst"]].mean()
    np.testing.assert_allclose(means["bias_mean"], expected.loc[means.index, "bias_0.3"])
    front = set(means.index[means["on_front"]])
    points = expected[["bias_0.3", "worst"]].to_numpy()
    assert front == {expected.index[i] for i in brute_force_front(points)}
    per_seed = analysis.pareto_points(results)
    assert per_seed["on_front"].sum() == len(
        brute_force_front(per_seed[["bias", "worst"]].to_numpy())
    )


# --- relif report ---------------------------------------------------------------------------


def run(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["report", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_report_writes_every_table_and_the_checklist(experiment_dir, direct, tmp_path, capsys):
    out = tmp_path / "report"
    status, stdout, _ = run(
        capsys,
        str(experiment_dir),
        "--out",
        str(out),
        "--delta",
        "0.3",
        "--delta-from",
        "erm:p75",
        *AUDIT_FLAGS,
        "--n-boot",
        "50",
        "--no-figures",
    )
    assert status == 0 and stdout.strip() == str(out / "report.md")
    for name in (
        "main",
        "paired",
        "violation",
        "drift",
        "shift",
        "certificate",
        "ablation",
        "delta_sensitivity",
        "controller",
    ):
        for suffix in ("md", "tex", "csv"):
            assert (out / "tables" / f"{name}.{suffix}").is_file(), (name, suffix)
    main_csv = pd.read_csv(out / "tables" / "main.csv").set_index("method")
    expected = direct.groupby("variant")[["worst", "bias_0.3", "bias_p75"]].agg(["mean", "std"])
    for key in ("worst", "bias_0.3", "bias_p75"):
        np.testing.assert_allclose(
            main_csv[f"{key}_mean"], expected.loc[main_csv.index, (key, "mean")]
        )
        np.testing.assert_allclose(
            main_csv[f"{key}_std"], expected.loc[main_csv.index, (key, "std")]
        )
    assert (main_csv["bias_0.3_ci_low"] <= main_csv["bias_0.3_mean"]).all()
    report = (out / "report.md").read_text()
    for fragment in (
        "Audit split: **test**",
        "N_eval = 16",
        "pair_seed = 42",
        "S = 256",
        "δ=0.3 = 0.300000: given as a number (--delta 0.3)",
        "(--delta-from erm:p75)",
        "SAME-SEED ERM",
        "diagnostics",
        "same checkpoint",
        "## Controller settings",
        "RuntimeError: synthetic 0",
        "bootstrap interval of the seed mean over the audit's sampled pairs, 50 replicates: "
        "the pair-sampling uncertainty only, not an interval over seeds",
        "## Summary: verdicts over seeds",
        "## Paired comparisons with same-seed ERM, over seeds",
    ):
        assert fragment in report, fragment
    record = json.loads((out / "delta_ref.json").read_text())
    assert record["primary"] == "0.3" and record["deltas"][1]["reference"] == "erm"
    assert len(pd.read_csv(out / "per_trial.csv")) == len(direct)


def test_report_figures_are_pngs(tmp_path, capsys):
    root = write_synthetic_experiment(
        tmp_path / "small", labels=("erm", "relif"), seeds=2, n_examples=20
    )
    out = tmp_path / "out"
    status, _, _ = run(capsys, str(root), "--out", str(out), *AUDIT_FLAGS, "--n-boot", "0")
    assert status == 0
    names = sorted(p.name for p in (out / "figures").iterdir())
    expected = ["delta_sensitivity.png", "pareto.png", "rank_shift.png", "score_distributions.png"]
    assert names == ["controller_relif.png", *expected]
    for path in (out / "figures").iterdir():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert "![pareto](figures/pareto.png)" in report
    assert "![score_distributions](figures/score_distributions.png)" in report
    ranking = report.split("### Raw versus fixed-δ ranking", 1)[1].split("\n### ", 1)[0]
    assert "![rank_shift](figures/rank_shift.png)" in ranking  # beside the shift table
    assert "Skipped: no ReLiF variant with a component switched off" in report
    assert "δ_p75" in report and "δ_p50" in report  # the NYUv2 default


def test_clinical_default_delta(tmp_path, capsys):
    root = write_synthetic_experiment(
        tmp_path / "mimic", labels=("erm", "relif"), seeds=2, dataset="mimic3"
    )
    status, _, _ = run(
        capsys,
        str(root),
        "--out",
        str(tmp_path / "out"),
        *AUDIT_FLAGS,
        "--n-boot",
        "0",
        "--no-figures",
    )
    assert status == 0
    assert (
        "δ=0.275 = 0.275000: given as a number (--delta 0.275)"
        in (tmp_path / "out" / "report.md").read_text()
    )


def test_report_lists_an_experiment_of_errored_trials_only(tmp_path, capsys):
    root = write_synthetic_experiment(tmp_path / "bad", labels=(), errored=2)
    status, _, _ = run(capsys, str(root), "--out", str(tmp_path / "out"))
    assert status == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "No finished trials" in report and report.count("errored: ") == 2


@pytest.mark.parametrize(
    ("setup", "flags", "fragment"),
    [
        ("missing", [], "experiment directory not found"),
        ("empty", [], "no trials found"),
        ("no_erm", [], "no ERM trials to calibrate delta_ref"),
        ("no_erm", ["--delta", "0.2"], "no ERM trial with seed 0 (nyuv2)"),
        ("ok", ["--pairs", "0"], "--pairs: must be a positive integer"),
        ("ok", ["--split", "test"], "--split test: the trials have no test split"),
        ("ok", ["--drift-baseline", "nosuch"], "--drift-baseline: no method 'nosuch'"),
        ("ok", ["--delta", "0.2", "--delta", "0.2"], "the same threshold is given twice"),
        ("ok", ["--delta-from", "erm:75"], "the quantile must look like p75"),
        ("ok", ["--sensitivity-deltas", "0.1,x"], "--sensitivity-deltas value must be a number"),
        ("ok", ["--equivalence-margin", "0"], "equivalence margin: must be a positive number"),
        ("ok", ["--ratio-floor", "0"], "ratio floor: must be in (0, 1), got 0.0"),
        ("ok", ["--adjust", "foo"], "--adjust: must be holm, fdr_bh or none, got 'foo'"),
        ("ok", ["--delta-m-epochs", "sometimes"], "--delta-m-epochs: final, best or last:K"),
        ("ok", ["--delta-m-epochs", "last:0"], "--delta-m-epochs: K must be a positive integer"),
        ("ok", ["--delta-m-base", "nosuch.json"], "--delta-m-base: no such file: nosuch.json"),
        ("mixed", [], "several data sets"),
    ],
)
def test_report_errors_are_one_line_with_status_2(tmp_path, capsys, setup, flags, fragment):
    root = tmp_path / "exp"
    if setup == "empty":
        root.mkdir()
    elif setup == "no_erm":
        write_synthetic_experiment(root, labels=("relif",), seeds=1, n_examples=10)
    elif setup == "ok":
        write_synthetic_experiment(root, labels=("erm", "relif"), seeds=1, n_examples=10)
    elif setup == "mixed":
        write_synthetic_experiment(root, labels=("erm",), seeds=1, n_examples=10)
        other = write_synthetic_experiment(
            tmp_path / "m", labels=("erm",), seeds=1, dataset="eicu", n_examples=10
        )
        flags = [str(other)]
    status, _, stderr = run(
        capsys, str(root), *flags, "--out", str(tmp_path / "out"), "--n-boot", "0", "--no-figures"
    )
    assert status == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("relif: error: "), stderr
    assert fragment in lines[0]


def test_a_report_whose_audit_finds_no_trial_is_one_line(tmp_path, capsys, monkeypatch):
    """Never a traceback from an audit that came back empty (every trial left out), and no
    report folder."""
    import relif_ray.analysis.report as report

    audit = report.audit
    monkeypatch.setattr(
        report,
        "audit",
        lambda *args, **kwargs: dataclasses.replace(
            audited := audit(*args, **kwargs), per_trial=audited.per_trial.iloc[:0], variants=[]
        ),
    )
    root = write_synthetic_experiment(tmp_path / "exp", labels=("erm", "relif"), seeds=1)
    status, _, stderr = run(capsys, str(root), "--out", str(tmp_path / "out"), "--no-figures")
    assert status == 2
    assert stderr.strip().splitlines() == [
        "relif: error: no trial could be audited on the val split: nothing to report"
    ]
    assert not (tmp_path / "out").exists()


# --- end to end on real engine outputs ----------------------------------------------------


@pytest.mark.slow
def test_report_on_outputs_of_real_training_runs(nyuv2_dir, tmp_path, capsys):
    """Two real (tiny) trials - ERM and ReLiF, seed 0 - trained by the engine and written as
    the Tune layer writes them; the report's Bias is the library audit of their scores."""
    from relif_ray.config import ExperimentConfig
    from relif_ray.engine import TrainingRun
    from relif_ray.experiment.outputs import write_trial_outputs
    from relif_ray.experiment.record import TrialRecord
    from tests.conftest import tiny_config

    root = tmp_path / "exp"
    constants = {}  # ReLiF trains on the same-seed ERM run's squash constants, as in a sweep
    for index, label in enumerate(("erm", "relif")):
        values = tiny_config(nyuv2_dir, epochs=1, max_steps=2)
        values["relif"] = {"enabled": label == "relif", "warmup_steps": 1, "eta": 0.5}
        values["relif"]["squash_constants"] = constants
        run_ = TrainingRun(ExperimentConfig.from_dict(values))
        while not run_.finished:
            run_.train_epoch()
        if label == "erm":
            constants.update(run_.evaluate("val").squash_constants(["depth", "normal"]))
        record = TrialRecord(
            trial_id=f"t{index}",
            label=label,
            method="erm",
            relif=label == "relif",
            seed=0,
            steps=run_.step,
            config=run_.config.to_dict(),
        )
        write_trial_outputs(
            root / f"trial_{index}" / "checkpoint_000000",
            record,
            {"val": run_.evaluate("val")},
            run_.trace,
        )
    status, _, stderr = run(
        capsys, str(root), "--out", str(tmp_path / "out"), "--n-boot", "0", "--no-figures"
    )
    assert status == 0, stderr
    stored = stored_trials(root)
    table = pd.read_csv(tmp_path / "out" / "tables" / "main.csv").set_index("method")
    record = json.loads((tmp_path / "out" / "delta_ref.json").read_text())
    delta = record["deltas"][0]["value"]
    for trial, row in zip(("t0", "t1"), ("erm", "relif"), strict=True):
        expected = fixed_delta_audit(squashed_scores(stored, trial, "val"), delta)
        assert table.loc[row, "bias_p75_mean"] == pytest.approx(expected.bias, abs=1e-12)
    assert set(itertools.chain(table.index)) == {"erm", "relif"}


def test_the_report_flags_a_controller_that_did_not_act(experiment_dir, tmp_path, capsys):
    """The controller-activity rule on the traces the trials stored: at eta 1e-3 over 40 steps
    lambda stays within 10% of lambda0 (inert, flagged beside the verdicts); at eta 0.5 with a
    violation rate near 0.3 above r* 0.16 it leaves that band (not flagged). The static-lambda
    and without-Lipschitz ablations do not adapt lambda and are not listed."""
    from relif_ray.analysis.controller_activity import controller_activity

    experiment = analysis.load(experiment_dir)
    activity = controller_activity(experiment)
    settings = ("(r*=0.24, eta=0.001)", "(r*=0.16, eta=0.5)")
    labels = ("relif", "relif-noalign")
    expected = {f"{label} {setting}" for label in labels for setting in settings}
    assert set(activity["variant"]) == expected
    traces = experiment.traces.sort_values(["trial", "step"])
    traces = traces.groupby("trial", observed=True)["lambda"]
    for row in activity.itertuples():
        lambdas = traces.get_group(row.trial)
        assert (row.lambda_low, row.lambda_high) == (lambdas.min(), lambdas.max())
        assert row.lambda_final == lambdas.iloc[-1] and row.eta_x_steps == row.eta * row.steps
        assert row.inert == (row.eta == 1e-3)
        assert row.inert == bool((abs(lambdas / 0.1 - 1) <= 0.1).all())
    out = tmp_path / "report"
    status, _, _ = run(capsys, str(experiment_dir), "--out", str(out), *AUDIT_FLAGS,
                       "--n-boot", "0", "--no-figures")  # fmt: skip
    assert status == 0
    report = (out / "report.md").read_text()
    summary = report.split("## Summary: verdicts over seeds")[1].split("\n## ")[0]
    flag = "controller inert: λ stayed within 10% of λ0 on every seed"
    bullets = [line for line in summary.splitlines() if line.startswith("- **")]
    lines = {line.split("**")[1]: line for line in bullets}
    assert flag in lines["ReLiF (r*=0.24, eta=0.001)"]
    assert "inert" not in lines["ReLiF (r*=0.16, eta=0.5)"]
    assert "## Controller activity" in report
    stored = pd.read_csv(out / "controller_activity.csv")
    assert stored["inert"].tolist() == activity["inert"].tolist()
