"""The family of a report's verdicts (`relif_ray.analysis.family`): its adjusted p-values are
statsmodels' `multipletests` on the report's own p-values (the Summary's and the group
audit's), each p-value is its verdict's test, and on a constructed experiment a comparison
shown alone is said not to hold after Holm over the family."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from relif_ray import analysis
from relif_ray.analysis.delta import DeltaRef
from relif_ray.analysis.family import MEMBER_COLUMNS, Family, adjust_verdicts
from relif_ray.analysis.paired import PAIRED_COLUMNS
from relif_ray.analysis.verdicts import VerdictSettings
from relif_ray.cli import main
from relif_ray.data.synthetic_eicu import write_synthetic_eicu
from relif_ray.testing.synthetic_experiment import write_synthetic_experiment

FLAGS = ["--n-boot", "0", "--no-figures", "--pool-size", "16", "--pairs", "256"]
SUMMARY = {("bias", "0.06"), ("worst", ""), ("macro", ""), ("delta_m", "")}
"""The Summary's comparisons of an eICU report (its primary delta_ref: 0.06)."""


@pytest.fixture(scope="module")
def clinical(tmp_path_factory) -> tuple[Path, Path]:
    """A generated eICU experiment (ERM, ReLiF, PCGrad, 3 seeds) and its patient attributes."""
    folder = tmp_path_factory.mktemp("family")
    experiment = write_synthetic_experiment(
        folder / "exp", labels=("erm", "relif", "pcgrad"), seeds=3, dataset="eicu",
        n_examples=120,
    )  # fmt: skip
    return experiment, write_synthetic_eicu(folder / "eicu", patients=120, seed=0)


def read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype={"delta": str}).fillna({"delta": ""})


@pytest.mark.parametrize("adjust", ["holm", "fdr_bh", "none"])
@pytest.mark.slow
def test_the_adjusted_p_values_are_statsmodels_on_the_reports_own(clinical, tmp_path, adjust):
    """The family is the Summary's comparisons of paired.csv and the group audit's verdicts
    that have a p-value; p_adjusted is `multipletests` of their p at alpha 0.05 (none: p
    itself); each group p is scipy's t test of its per-seed differences (group_paired.csv);
    the group table's CSV carries the same numbers; the report lists the family once."""
    experiment, attributes = clinical
    out = tmp_path / "report"
    flags = ["--attributes", str(attributes), "--min-group-size", "5", "--adjust", adjust]
    assert main(["report", str(experiment), "--out", str(out), *FLAGS, *flags]) == 0
    paired = read(out / "tables" / "paired.csv")
    verdicts = pd.read_csv(out / "group_verdicts.csv")
    summary = np.array(
        [key in SUMMARY for key in zip(paired["metric"], paired["delta"], strict=True)]
    )
    expected_paired = paired[summary & paired["p"].notna()]
    expected_groups = verdicts[verdicts["p"].notna()]
    assert len(expected_paired) == 6 and len(expected_groups) == 36  # 2 methods: 3 + 18 each
    members = pd.concat(
        [paired[paired["family_size"].notna()], verdicts[verdicts["family_size"].notna()]]
    )
    assert len(members) == len(expected_paired) + len(expected_groups) == 42
    assert (members["family_size"] == 42).all()
    assert paired["family_size"].notna().tolist() == (summary & paired["p"].notna()).tolist()
    p = members["p"].to_numpy()
    if adjust == "none":
        np.testing.assert_array_equal(members["p_adjusted"], p)
    else:
        adjusted = multipletests(p, alpha=0.05, method=adjust)[1]
        np.testing.assert_allclose(members["p_adjusted"], adjusted, rtol=1e-12, atol=0)
        assert (members["p_adjusted"] >= p - 1e-15).all()
    differences = pd.read_csv(out / "group_paired.csv")
    keys = ["variant", "task", "attribute", "metric"]
    for row in expected_groups.itertuples():
        chosen = np.logical_and.reduce([differences[k] == getattr(row, k) for k in keys])
        values = differences.loc[chosen, "difference"].dropna().to_numpy()
        assert row.p == pytest.approx(stats.ttest_1samp(values, 0.0).pvalue, rel=1e-9)
    table = pd.read_csv(out / "tables" / "group_disparities.csv").dropna(subset=["p"])
    merged = table.merge(verdicts, on=["task", "attribute", "metric", "p"], suffixes=("", "_v"))
    assert len(merged) == len(table) == len(expected_groups)
    np.testing.assert_array_equal(merged["p_adjusted"], merged["p_adjusted_v"])
    text = (out / "report.md").read_text()
    assert text.count("The family of this report's verdicts") == 1
    assert f"(`--adjust {adjust}`): 42 comparisons" in text
    assert "- ReLiF (21): Bias@δ=0.06, Worst, Macro; group audit: mortality by gender: DP " in text
    name = {"holm": "Holm", "fdr_bh": "Benjamini-Hochberg", "none": None}[adjust]
    assert (f"after {name} over 42 comparisons" in text) == (name is not None)


def write_worst(experiment: Path, label: str, differences: dict[int, float]) -> None:
    """Set each `label` trial's val Worst (trial.json) to its same-seed ERM trial's plus
    `differences[seed]`."""
    records = {}
    for path in experiment.glob("*/checkpoint_000000/outputs/trial.json"):
        info = json.loads(path.read_text())
        records[info["label"], info["seed"]] = (path, info)
    for seed, difference in differences.items():
        path, info = records[label, seed]
        info["metrics"]["val"]["worst"] = records["erm", seed][1]["metrics"]["val"]["worst"]
        info["metrics"]["val"]["worst"] += difference
        path.write_text(json.dumps(info, indent=2, sort_keys=True))


def test_a_comparison_shown_alone_is_not_shown_after_holm(tmp_path):
    """ReLiF's Worst is constructed 0.010, 0.030, 0.020, 0.005 and 0.035 below ERM's at the
    five seeds: a t test alone shows it lower (p = 0.025), but not after Holm over the
    report's 8 comparisons, while ReLiF's Bias cut holds after it. The Summary gives the
    equivalence bound of Worst and ERM's spread over seeds to read the margin against."""
    experiment = write_synthetic_experiment(
        tmp_path / "exp", labels=("erm", "relif", "pcgrad"), seeds=5, n_examples=24
    )
    differences = {0: -0.010, 1: -0.030, 2: -0.020, 3: -0.005, 4: -0.035}
    write_worst(experiment, "relif", differences)
    out = tmp_path / "report"
    assert main(["report", str(experiment), "--out", str(out), *FLAGS]) == 0
    paired = read(out / "tables" / "paired.csv").set_index(["label", "metric", "delta"])
    worst = paired.loc["relif", "worst", ""]
    expected = stats.ttest_1samp(list(differences.values()), 0.0).pvalue
    assert worst["p"] == pytest.approx(expected, rel=1e-6) and worst["p"] == pytest.approx(
        0.0247, abs=1e-4
    )
    members = paired[paired["family_size"].notna()]
    assert len(members) == 8
    holm = multipletests(members["p"], alpha=0.05, method="holm")[1]
    np.testing.assert_allclose(members["p_adjusted"], holm, rtol=1e-12, atol=0)
    assert worst["verdict"] == "lower than ERM (95%, 5 seeds)" and worst["p_adjusted"] >= 0.05
    bias = paired.loc["relif", "bias", "p75"]
    assert bias["verdict"] == "lower than ERM (95%, 5 seeds)" and bias["p_adjusted"] < 0.05
    text = (out / "report.md").read_text()
    assert (
        "Worst -0.020 against ERM [-0.036, -0.004], 90% [-0.032, -0.008]: lower than ERM "
        "(95%, 5 seeds; not after Holm over 8 comparisons), equivalence bound: within "
        "±0.033 (90%)" in text
    )
    assert ": lower than ERM (95%, 5 seeds; also after Holm over 8 comparisons), per seed" in text
    erm = pd.read_csv(out / "per_trial.csv").query("label == 'erm'")[["worst", "macro"]].std()
    assert (
        "ERM's standard deviation over its 5 seeds, to read the margin ±0.02 against: Worst "
        f"{erm['worst']:.2g} and Macro {erm['macro']:.2g} (the margin is "
        f"{0.02 / erm['worst']:.1f} and {0.02 / erm['macro']:.1f} of them)." in text
    )


def family(p_adjusted: list[float], adjust: str = "holm") -> Family:
    members = pd.DataFrame(
        [["relif", "summary", f"c{i}", p, p] for i, p in enumerate(p_adjusted)],
        columns=MEMBER_COLUMNS,
    )
    return Family(adjust, 0.95, members)


def test_the_family_words_every_verdict_form():
    """The adjustment goes into the verdict's first parenthesis, which for "within ..., though
    lower" is the equivalence's; verdicts that show nothing, comparisons outside the family
    (NaN) and `none` are left as they are."""
    words = family([0.01, 0.2, 0.3])
    assert words.verdict("lower than ERM (95%, 10 seeds)", 0.01) == (
        "lower than ERM (95%, 10 seeds; also after Holm over 3 comparisons)"
    )
    assert words.verdict("within ±0.02 of ERM (90%, 4 seeds)", 0.2) == (
        "within ±0.02 of ERM (90%, 4 seeds; not after Holm over 3 comparisons)"
    )
    assert words.verdict("within ±0.02 of ERM (90%), though lower (95%, 5 seeds)", 0.03) == (
        "within ±0.02 of ERM (90%; also after Holm over 3 comparisons), though lower (95%, 5 seeds)"
    )
    for verdict in ("not shown with 3 seeds", "no verdict: the 3 seeds did not vary"):
        assert words.verdict(verdict, 0.5) == verdict
    assert words.verdict("lower than ERM (95%, 10 seeds)", math.nan) == (
        "lower than ERM (95%, 10 seeds)"
    )
    bh = family([0.01], "fdr_bh").verdict("higher than ERM (95%, 2 seeds)", 0.06)
    assert bh == "higher than ERM (95%, 2 seeds; not after Benjamini-Hochberg over 1 comparison)"
    assert family([0.01], "none").verdict("lower than ERM (95%, 2 seeds)", 0.01) == (
        "lower than ERM (95%, 2 seeds)"
    )


def test_a_report_without_comparisons_has_an_empty_family():
    delta = DeltaRef(0.3, "p75", "δ_p75", r"\delta_{p75}", "given")
    adjusted = adjust_verdicts(pd.DataFrame(columns=PAIRED_COLUMNS), None, delta, VerdictSettings())
    assert adjusted.family.size == 0 and adjusted.groups is None
    assert list(adjusted.paired.columns[-2:]) == ["p_adjusted", "family_size"]
    assert "0 comparisons" in adjusted.family.lines()[1]


@pytest.mark.slow
def test_the_api_gives_the_reports_family(clinical, tmp_path):
    """`analysis.report_family` on the same experiment gives paired.csv's and
    group_verdicts.csv's adjusted p-values, and the group tables the report shows."""
    experiment, attributes = clinical
    out = tmp_path / "report"
    flags = ["--attributes", str(attributes), "--min-group-size", "5"]
    assert main(["report", str(experiment), "--out", str(out), *FLAGS, *flags]) == 0
    loaded = analysis.load(experiment)
    settings = analysis.AuditSettings(pool_size=16, pairs=256)
    results = analysis.audit(loaded, settings=settings)
    groups = analysis.group_audit(
        loaded, options=analysis.GroupOptions(str(attributes), min_group_size=5)
    )
    adjusted = analysis.report_family(results, groups, analysis.VerdictSettings(n_boot=0))
    paired = read(out / "tables" / "paired.csv")
    np.testing.assert_allclose(adjusted.paired["p_adjusted"], paired["p_adjusted"], rtol=1e-12)
    verdicts = pd.read_csv(out / "group_verdicts.csv")
    np.testing.assert_allclose(
        adjusted.groups.verdicts["p_adjusted"], verdicts["p_adjusted"], rtol=1e-12
    )
    for table in analysis.group_tables(adjusted.groups, adjusted.family):
        assert (out / "tables" / f"{table.name}.md").read_text() == table.markdown()
