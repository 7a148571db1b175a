"""The audit interfaces of `relif_ray.squash` (the paper's q10/q90 squash, the wider q1/q99
squash, the ERM empirical CDF), `analysis.audit`'s `interface` and the report's
"Audit-interface sensitivity" table.

Interfaces are checked against hand computations on tiny arrays; the table against Bias and
ratios recomputed from the generated trial files with numpy and `relif_ray.audit` only.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from relif_ray import analysis
from relif_ray.analysis.audit_scores import audit_scores
from relif_ray.analysis.interfaces import interface_table
from relif_ray.analysis.report import ReportOptions, write_report
from relif_ray.analysis.tables import CISettings, Skipped
from relif_ray.audit import fixed_delta_audit
from relif_ray.errors import UserError
from relif_ray.reference import write_squash_constants
from relif_ray.squash import AUDIT_INTERFACES, audit_interface, empirical_cdf, squash_bounds
from relif_ray.testing.synthetic_experiment import write_synthetic_experiment
from tests.test_analysis import SETTINGS, StoredTrial, stored_trials

CI = CISettings(n_boot=40)
REPORT = ReportOptions(settings=SETTINGS, ci=CI, figures=False)


# --- the interfaces on tiny arrays --------------------------------------------------------


def test_the_three_interfaces_by_hand():
    reference = np.array([5.0, 1.0, 3.0, 2.0, 4.0])
    raw = np.array([0.5, 1.0, 2.5, 3.0, 5.0, 7.0])
    paper = audit_interface("q10-q90")
    low, high = paper.constants(reference)  # numpy linear: 1 + 0.4 * 1, 4 + 0.6 * 1
    assert (low, high) == pytest.approx((1.4, 4.6), abs=1e-12)
    expected = [0.0, 0.0, 1.1 / (3.2 + 1e-6), 1.6 / (3.2 + 1e-6), 1.0, 1.0]
    assert paper.apply(raw, paper.constants(reference)) == pytest.approx(expected, abs=1e-12)
    wide = audit_interface("q1-q99")
    assert squash_bounds(reference, "q1-q99") == pytest.approx([1.04, 4.96], abs=1e-12)
    span = 3.92 + 1e-6
    expected = [0.0, 0.0, 1.46 / span, 1.96 / span, 1.0, 1.0]  # 5 > q99 = 4.96: clipped
    assert wide.apply(raw, wide.constants(reference)) == pytest.approx(expected, abs=1e-12)
    ecdf = audit_interface("ecdf")
    assert list(ecdf.constants(reference)) == [1.0, 2.0, 3.0, 4.0, 5.0]  # sorted
    # #{r <= s} / 5: below the smallest 0, a tie counts itself, from the largest on 1
    assert list(ecdf.apply(raw, ecdf.constants(reference))) == [0.0, 0.2, 0.4, 0.6, 1.0, 1.0]


def test_the_empirical_cdf_counts_ties_and_keeps_nan():
    reference = np.array([1.0, 2.0, 2.0, 3.0])
    values = empirical_cdf(np.array([1.999, 2.0, 2.001, np.nan]), reference)
    assert values[:3].tolist() == [0.25, 0.75, 0.75] and np.isnan(values[3])


def test_unknown_interfaces_and_bounds_of_the_cdf_are_one_line_errors():
    with pytest.raises(UserError, match=r"^audit interface 'q5-q95': must be one of "
                       r"q10-q90, q1-q99, ecdf$"):  # fmt: skip
        audit_interface("q5-q95")
    with pytest.raises(UserError, match="is not a squash"):
        squash_bounds([1.0, 2.0], "ecdf")
    assert list(AUDIT_INTERFACES) == ["q10-q90", "q1-q99", "ecdf"]


# --- analysis.audit under each interface ----------------------------------------------------


@pytest.fixture(scope="module")
def experiment_dir(tmp_path_factory):
    return write_synthetic_experiment(
        tmp_path_factory.mktemp("interfaces") / "exp",
        labels=("erm", "relif", "pcgrad"),
        seeds=3,
        n_examples=30,
    )


@pytest.fixture(scope="module")
def stored(experiment_dir) -> dict[str, StoredTrial]:
    return stored_trials(experiment_dir)


def mapped_scores(trials: dict[str, StoredTrial], trial: str, interface: str) -> pd.DataFrame:
    """The trial's validation scores with depth/normal mapped by hand from the same-seed ERM
    trial's valid validation scores: the squash with np.quantile, or mean(ERM <= s)."""
    stored = trials[trial]
    scores = stored.scores[stored.scores["split"] == "val"].copy()
    scores["score"] = scores["score"].astype(np.float64)
    (erm,) = [t for t in trials.values() if t.is_erm and t.seed == stored.seed]
    reference = erm.scores[(erm.scores["split"] == "val") & erm.scores["valid"]]
    for task in ("depth", "normal"):
        raw = reference.loc[reference["task"] == task, "score"].to_numpy(np.float64)
        rows = scores["task"] == task
        values = scores.loc[rows, "score"].to_numpy()
        if interface == "ecdf":
            mapped = (raw[None, :] <= values[:, None]).mean(axis=1)
        else:
            q = {"q10-q90": [0.1, 0.9], "q1-q99": [0.01, 0.99]}[interface]
            low, high = np.quantile(raw, q)
            mapped = np.clip((values - low) / (high - low + 1e-6), 0.0, 1.0)
        scores.loc[rows, "score"] = mapped
    return scores


@pytest.mark.parametrize("interface", list(AUDIT_INTERFACES))
def test_audit_scores_follow_the_interface(experiment_dir, stored, interface):
    scores = audit_scores(analysis.load(experiment_dir), interface)
    for trial in stored:
        mine = scores[(scores["trial"] == trial) & (scores["split"] == "val")]
        expected = mapped_scores(stored, trial, interface)
        merged = mine.merge(expected, on=["task", "example_id"], suffixes=("", "_hand"))
        assert len(merged) == len(expected)
        np.testing.assert_allclose(merged["score"], merged["score_hand"], rtol=0, atol=1e-12)


def test_analysis_audit_takes_the_interface(experiment_dir, stored):
    results = analysis.audit(
        analysis.load(experiment_dir), 0.2, settings=SETTINGS, sensitivity=(), interface="ecdf"
    )
    assert results.interface == "ecdf"
    bias = results.per_trial.set_index("trial")["bias_0.2"]
    for trial in stored:
        expected = fixed_delta_audit(mapped_scores(stored, trial, "ecdf"), 0.2, settings=SETTINGS)
        assert bias[trial] == pytest.approx(expected.bias, abs=1e-12)
    with pytest.raises(UserError, match="^audit interface 'cdf': must be one of"):
        analysis.audit(analysis.load(experiment_dir), 0.2, interface="cdf")


# --- the report's table ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def report_dir(experiment_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("interfaces_report")
    write_report(analysis.load(experiment_dir), out, REPORT)
    return out


def test_the_interface_table_recomputes_from_the_files(report_dir, stored):
    """Every row: Bias at the main table's primary delta under each interface, and the mean
    over seeds of Bias / same-seed ERM Bias, recomputed from the trial files."""
    main = pd.read_csv(report_dir / "per_trial.csv").set_index("trial")
    delta = json.loads((report_dir / "delta_ref.json").read_text())["deltas"][0]
    table = pd.read_csv(report_dir / "tables" / "interfaces.csv")
    assert len(table) == 3 * 3 and list(table["method"][::3]) == ["erm", "relif", "pcgrad"]
    for interface in AUDIT_INTERFACES:
        bias = {
            trial: fixed_delta_audit(
                mapped_scores(stored, trial, interface), delta["value"], settings=SETTINGS
            ).bias
            for trial in stored
        }
        erm = {record.seed: trial for trial, record in stored.items() if record.is_erm}
        if interface == "q10-q90":  # (a) is the main table's audit
            assert main["bias_p75"].to_dict() == pytest.approx(bias, abs=1e-12)
        rows = table[table["interface"].str.endswith(f" {interface}")].set_index("method")
        for variant, trials in main.groupby("variant").groups.items():
            ratios = [bias[t] / bias[erm[stored[t].seed]] for t in trials]
            row = rows.loc[variant]
            assert row["bias_mean"] == pytest.approx(np.mean([bias[t] for t in trials]))
            assert row["ratio_mean"] == pytest.approx(np.mean(ratios), abs=1e-12)
            assert row["ratio_std"] == pytest.approx(np.std(ratios, ddof=1), abs=1e-12)
            assert row["cut"] == cut_over_seeds(variant, ratios), (interface, variant)
    paper = table[table["interface"] == "(a) q10-q90"].set_index("method")["ratio_mean"]
    for _, row in table[table["interface"] != "(a) q10-q90"].iterrows():
        assert row["change"] == pytest.approx(row["ratio_mean"] - paper[row["method"]])


def cut_over_seeds(variant: str, ratios: list[float]) -> str:
    """The cut over seeds by hand: the 95% Student-t interval of the mean log ratio (scipy's
    t quantile), its verdict, the geometric mean ratio and the interval's ends."""
    if variant == "erm":
        return "reference"
    logs = np.log(ratios)
    half = stats.t.ppf(0.975, len(logs) - 1) * np.std(logs, ddof=1) / np.sqrt(len(logs))
    low, high = logs.mean() - half, logs.mean() + half
    n = f"(95%, {len(logs)} seeds)"
    verdict = (
        f"lower than ERM {n}"
        if high < 0
        else f"higher than ERM {n}"
        if low > 0
        else f"not shown with {len(logs)} seeds"
    )
    ends = f"{np.exp(logs.mean()):.2f}x [{np.exp(low):.2f}, {np.exp(high):.2f}]"
    return f"{verdict}: {ends}"


def test_the_report_says_whether_each_cut_holds(report_dir):
    report = (report_dir / "report.md").read_text()
    section = report[report.index("## Audit-interface sensitivity") :]
    section = section[: section.index("\n## ", 5)]
    table = pd.read_csv(report_dir / "tables" / "interfaces.csv")
    assert set(table["cut"]) != {"reference"}  # the methods have verdicts
    for row in table[table["method"] != "erm"].itertuples():
        assert f"{row.interface}: {row.cut}" in section, (row.method, row.interface)
    assert "interface_per_trial.csv" in section
    assert "Audit-interface sensitivity table" in report  # the Saturated flag points to it
    per_trial = pd.read_csv(report_dir / "interface_per_trial.csv")
    assert len(per_trial) == 3 * 9 and (per_trial["ratio"] > 0).all()


def test_a_clinical_report_skips_the_table_in_one_line(tmp_path):
    root = write_synthetic_experiment(
        tmp_path / "mimic", labels=("erm", "relif"), seeds=2, dataset="mimic3", n_examples=20
    )
    options = ReportOptions(settings=SETTINGS, ci=CISettings(n_boot=0), figures=False)
    report = write_report(analysis.load(root), tmp_path / "out", options).read_text()
    section = report[report.index("## Audit-interface sensitivity") :].splitlines()
    assert section[1] == (
        "Skipped: every audit score of mimic3 is a probability, used as it is: no squashed "
        "task, so every audit interface gives the same scores."
    )
    assert not (tmp_path / "out" / "interface_per_trial.csv").exists()


def test_lent_squash_constants_allow_only_the_papers_interface(tmp_path):
    """A `--reference` sweep has no ERM trial, only q10/q90 in squash_constants.json."""
    root = write_synthetic_experiment(tmp_path / "lent", labels=("relif",), seeds=1)
    write_squash_constants(root, {"0": {"depth": [0.5, 2.0], "normal": [0.5, 2.0]}})
    experiment = analysis.load(root)
    results = analysis.audit(experiment, 0.2, settings=SETTINGS, sensitivity=())
    table = interface_table(results, CISettings(n_boot=0))
    assert isinstance(table, Skipped) and "squash_constants.json (--reference)" in table.reason
    with pytest.raises(UserError, match="^audit interface 'ecdf': trial .* no same-seed ERM"):
        analysis.audit(experiment, 0.2, settings=SETTINGS, interface="ecdf")
