"""The group audit of clinical trials (`relif_ray.analysis.groups`): its numbers are Fairlearn's and
scikit-learn's, and a tiny case is checked by hand; the stays are joined to the attributes of
the synthetic MIMIC-III and eICU files through the real readers, stays without an attribute
row are counted in one warning and kept in the unknown group; malformed attribute files are
one line; the report has the section, or one line saying why not."""

from __future__ import annotations

import csv
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fairlearn.metrics import (
    demographic_parity_difference,
    equalized_odds_difference,
    false_positive_rate,
    selection_rate,
    true_positive_rate,
)
from sklearn.metrics import cohen_kappa_score, roc_auc_score

from relif_ray.analysis.groups import (
    GroupOptions,
    MissingAttributes,
    age_band,
    attribute_groups,
    paired_differences,
    paired_verdicts,
    task_groups,
)
from relif_ray.analysis.verdicts import VerdictSettings
from relif_ray.cli.console import main as relif
from relif_ray.data.attributes import UNKNOWN
from relif_ray.data.eicu import read_eicu_attributes
from relif_ray.data.mimic3 import read_listfile
from relif_ray.data.mimic3_root import read_mimic3_attributes
from relif_ray.data.synthetic_eicu import write_synthetic_eicu
from relif_ray.data.synthetic_mimic3 import write_synthetic_mimic3
from relif_ray.errors import UserError
from relif_ray.tasks.clinical import LOS_BIN_EDGES_HOURS
from relif_ray.testing.synthetic_experiment import write_synthetic_experiment

# --- the numbers ------------------------------------------------------------------------


def outcome_rows(kind: str, rng: np.random.Generator, stays: int = 90) -> pd.DataFrame:
    """Outcome rows of one task (as `relif_ray.experiment.outputs.read_outcomes` gives them)."""
    width = {"binary": 1, "multilabel": 4, "length_of_stay": 3}[kind]
    ids = np.repeat(np.arange(stays), width)
    if kind == "length_of_stay":
        label = rng.exponential(150.0, ids.size)
        true_bin = np.searchsorted(LOS_BIN_EDGES_HOURS, label, side="right")
        prediction = np.clip(true_bin + rng.integers(-2, 3, ids.size), 0, 9)
    else:
        label = (rng.random(ids.size) < 0.35).astype(float)
        prediction = rng.normal(1.2 * label - 0.6, 1.0)
    return pd.DataFrame(
        {
            "example_id": ids,
            "position": np.tile(np.arange(width), stays),
            "label": label,
            "prediction": prediction,
        }
    )


def sklearn_auroc(y_true: np.ndarray, score: np.ndarray) -> float:
    return roc_auc_score(y_true, score) if len(np.unique(y_true)) == 2 else np.nan


@pytest.mark.parametrize("kind", ["binary", "multilabel", "length_of_stay"])
def test_group_metrics_equal_fairlearn_and_scikit_learn_on_hand_made_data(kind):
    rng = np.random.default_rng(3)
    rows = outcome_rows(kind, rng)
    stay_group = rng.choice(["a", "b", "c", "tiny"], size=90, p=[0.4, 0.3, 0.27, 0.03])
    sensitive = stay_group[rows["example_id"]]
    options = GroupOptions(min_group_size=10)
    per_group, disparities = task_groups(rows, kind, sensitive, options)
    per_group = per_group.set_index("group")

    label, prediction = rows["label"].to_numpy(), rows["prediction"].to_numpy()
    if kind == "length_of_stay":
        y_true, y_pred = (label >= 168).astype(int), (prediction >= 7).astype(int)  # [168, 192)
    else:
        y_true, y_pred = label.astype(int), (1 / (1 + np.exp(-prediction)) >= 0.5).astype(int)
    compared = []
    for group in np.unique(sensitive):
        m = sensitive == group
        row = per_group.loc[group]
        assert row["stays"] == len(np.unique(rows["example_id"][m]))
        assert (row["samples"], row["positives"]) == (m.sum(), y_true[m].sum())
        assert row["small"] == (row["stays"] < 10)
        if kind == "binary":
            expected = sklearn_auroc(y_true[m], prediction[m])
        elif kind == "multilabel":
            index = rows["position"].to_numpy()[m]
            per_label = [
                sklearn_auroc(y_true[m][index == k], prediction[m][index == k]) for k in range(4)
            ]
            defined = [value for value in per_label if not np.isnan(value)]
            expected = np.mean(defined) if defined else np.nan
        else:
            true_bin = np.searchsorted(LOS_BIN_EDGES_HOURS, label[m], side="right")
            expected = cohen_kappa_score(true_bin, prediction[m].astype(int), weights="linear")
        np.testing.assert_allclose(row["value"], expected, rtol=0, atol=1e-12, equal_nan=True)
        tpr = true_positive_rate(y_true[m], y_pred[m]) if y_true[m].any() else np.nan
        fpr = false_positive_rate(y_true[m], y_pred[m]) if not y_true[m].all() else np.nan
        np.testing.assert_allclose(
            row[["tpr", "fpr"]].astype(float), [tpr, fpr], atol=1e-12, equal_nan=True
        )
        assert row["selection_rate"] == pytest.approx(selection_rate(y_true[m], y_pred[m]))
        if not row["small"]:
            compared.append(group)
    assert "tiny" not in compared and len(compared) == 3
    keep = np.isin(sensitive, compared)
    assert disparities["compared"] == 3
    assert disparities["demographic_parity_difference"] == pytest.approx(
        demographic_parity_difference(
            y_true[keep], y_pred[keep], sensitive_features=sensitive[keep]
        )
    )
    assert disparities["equalized_odds_difference"] == pytest.approx(
        equalized_odds_difference(y_true[keep], y_pred[keep], sensitive_features=sensitive[keep])
    )
    values = per_group.loc[compared, "value"]
    assert disparities["metric_gap"] == pytest.approx(values.max() - values.min())


def test_a_tiny_case_by_hand():
    """Six stays, two groups of three, mortality at threshold 0.5 (logit 0).

    group a: labels 1, 0, 0; logits 2, 1, -1 -> decisions 1, 1, 0: TPR 1, FPR 1/2, selected
        2/3, AUROC 1 (the positive outranks both negatives);
    group b: labels 1, 1, 0; logits -1, 3, 0.5 -> decisions 0, 1, 1: TPR 1/2, FPR 1, selected
        2/3, AUROC 1/2 (3 > 0.5 but -1 < 0.5).
    DP difference |2/3 - 2/3| = 0; EO difference max(|1 - 1/2|, |1/2 - 1|) = 1/2; AUROC gap
    1/2; overall AUROC: 3 positives x 3 negatives, the positives 2, -1, 3 against 1, -1, 0.5
    win 3 + (1/2 + 0) + 3 ... = (3 + 0.5 + 3) / 9 = 13/18 (-1 ties -1: one half)."""
    rows = pd.DataFrame(
        {
            "example_id": np.arange(6),
            "position": 0,
            "label": [1.0, 0.0, 0.0, 1.0, 1.0, 0.0],
            "prediction": [2.0, 1.0, -1.0, -1.0, 3.0, 0.5],
        }
    )
    groups = np.array(["a", "a", "a", "b", "b", "b"])
    per_group, disparities = task_groups(rows, "binary", groups, GroupOptions(min_group_size=3))
    by_group = per_group.set_index("group")
    assert by_group["tpr"].tolist() == [1.0, 0.5]
    assert by_group["fpr"].tolist() == [0.5, 1.0]
    assert by_group["selection_rate"].tolist() == pytest.approx([2 / 3, 2 / 3])
    assert by_group["value"].tolist() == [1.0, 0.5]
    assert disparities["demographic_parity_difference"] == 0.0
    assert disparities["equalized_odds_difference"] == 0.5
    assert disparities["metric_gap"] == 0.5
    assert disparities["overall"] == pytest.approx(13 / 18)
    tighter = task_groups(rows, "binary", groups, GroupOptions(threshold=0.9))[0]
    assert tighter.set_index("group")["selection_rate"].tolist() == [0.0, 1 / 3]  # logit 2.2
    small = task_groups(rows, "binary", groups, GroupOptions(min_group_size=4))[1]
    assert small["compared"] == 0 and np.isnan(small["equalized_odds_difference"])


def test_age_bands_are_half_open_and_a_missing_age_is_unknown():
    ages = np.array([17.9, 45.0, 64.99, 65.0, 80.0, 300.5, np.nan])
    assert list(age_band(ages, (45.0, 65.0, 80.0))) == [
        "<45", "[45, 65)", "[45, 65)", "[65, 80)", ">=80", ">=80", UNKNOWN,
    ]  # fmt: skip


def test_each_trial_is_paired_with_its_same_seed_erm_trial():
    trials = pd.DataFrame(
        {
            "trial": ["e0", "e1", "r0", "r1", "r2"],
            "label": ["erm", "erm", "relif", "relif", "relif"],
            "variant": ["erm", "erm", "relif", "relif", "relif"],
            "method": "erm",
            "relif": [False, False, True, True, True],
            "seed": [0, 1, 0, 1, 2],
            "dataset": "eicu",
            "experiment": "x",
        }
    )
    per_trial = trials[["trial", "label", "variant", "seed"]].assign(
        task="mortality",
        attribute="gender",
        demographic_parity_difference=[0.1, 0.2, 0.05, 0.3, 0.4],
        equalized_odds_difference=[0.2, 0.2, 0.2, 0.2, 0.2],
        metric_gap=[0.0, 0.1, 0.1, 0.0, 0.0],
    )
    paired = paired_differences(per_trial, trials)
    dp = paired[paired["metric"] == "demographic_parity_difference"].set_index("trial")
    assert set(paired["trial"]) == {"r0", "r1", "r2"}  # not the ERM trials themselves
    assert dp.loc["r0", ["erm_trial", "erm_value"]].tolist() == ["e0", 0.1]
    assert dp.loc["r0", "difference"] == pytest.approx(-0.05)
    assert dp.loc["r1", "difference"] == pytest.approx(0.1)
    assert np.isnan(dp.loc["r2", "erm_value"])  # seed 2 has no ERM trial
    assert list(paired.columns[:8]) == [
        "label", "variant", "seed", "attribute", "task", "metric", "value", "erm_value",
    ]  # fmt: skip
    verdicts = paired_verdicts(paired, VerdictSettings()).set_index("metric")
    dp_verdict = verdicts.loc["demographic_parity_difference"]
    assert (dp_verdict["n_seeds"], dp_verdict["estimate"]) == (2, pytest.approx(0.025))
    assert dp_verdict["verdict"] == "not shown with 2 seeds"
    eo_verdict = verdicts.loc["equalized_odds_difference"]  # 0 on both seeds
    assert eo_verdict["estimate"] == 0.0 and np.isnan(eo_verdict["ci_low"])
    assert eo_verdict["verdict"] == "no verdict: the 2 seeds did not vary"


# --- the attributes and their join ------------------------------------------------------


@pytest.fixture(scope="module")
def mimic3(tmp_path_factory) -> Path:
    return write_synthetic_mimic3(tmp_path_factory.mktemp("m3") / "data", patients=8, seed=0)


def stays_of(folder: Path) -> list[str]:
    listfiles = [folder / "train_listfile.csv", folder / "val_listfile.csv"]
    return [row.filename for path in listfiles for _, row in read_listfile(path)]


def test_mimic3_stays_join_the_root_folder_as_the_benchmark_joins_them(mimic3):
    stays = stays_of(mimic3)
    table = read_mimic3_attributes(mimic3 / "root", stays).set_index("stay")
    assert list(table.index) == stays
    for stay in stays:
        subject, episode = re.match(r"(\d+)_episode(\d+)_", stay).groups()
        folder = mimic3 / "root" / "train" / subject
        icustay = pd.read_csv(folder / f"episode{episode}.csv")["Icustay"].iloc[0]
        row = pd.read_csv(folder / "stays.csv").set_index("ICUSTAY_ID").loc[icustay]
        assert table.loc[stay, "gender"] == {"F": "female", "M": "male"}[row["GENDER"]]
        assert table.loc[stay, "age"] == pytest.approx(row["AGE"])
        words = row["ETHNICITY"].split(" ")[0].split("/")[0]
        expected = {"UNKNOWN": UNKNOWN, "UNABLE": UNKNOWN, "PATIENT": UNKNOWN}.get(words)
        expected = expected or {"WHITE": "white", "BLACK": "black", "HISPANIC": "hispanic",
                                "ASIAN": "asian"}.get(words, "other")  # fmt: skip
        assert table.loc[stay, "ethnicity"] == expected, row["ETHNICITY"]


def test_stays_without_an_attribute_row_are_counted_and_kept_as_unknown(mimic3, tmp_path):
    root = shutil.copytree(mimic3 / "root", tmp_path / "root")
    stays = stays_of(mimic3)
    first, second, third = (re.match(r"(\d+)_episode(\d+)_", s).groups() for s in stays[:3])
    (root / "train" / first[0] / f"episode{first[1]}.csv").unlink()  # no episode file
    shutil.rmtree(root / "train" / third[0])  # no subject folder
    path = root / "train" / second[0] / "stays.csv"  # no stays.csv row
    lines = path.read_text().splitlines()
    icustay = pd.read_csv(root / "train" / second[0] / f"episode{second[1]}.csv")["Icustay"][0]
    path.write_text("\n".join(line for line in lines if f",{icustay}," not in line) + "\n")
    lost = {s for s in stays if s.startswith((f"{first[0]}_episode{first[1]}",
            f"{second[0]}_episode{second[1]}", f"{third[0]}_"))}  # fmt: skip
    table = read_mimic3_attributes(root, stays)
    assert set(table["stay"]) == set(stays) - lost
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        groups = attribute_groups(table, stays, (45.0, 65.0), str(root), "val")
    assert [str(w.message) for w in caught if w.category is MissingAttributes] == [
        f"{len(lost)} of {len(stays)} stays of the val split have no attribute row in {root}: "
        f"they are in the '{UNKNOWN}' group of every attribute"
    ]
    assert (groups.loc[sorted(lost)] == UNKNOWN).all().all() and len(groups) == len(stays)


def test_eicu_attributes_are_the_benchmark_codes_of_each_stay(tmp_path):
    folder = write_synthetic_eicu(tmp_path / "eicu", patients=12, seed=1)
    table = read_eicu_attributes(folder).set_index("stay")
    with open(folder / "all_data.csv", newline="") as handle:
        first = {row["patientunitstayid"]: row for row in reversed(list(csv.DictReader(handle)))}
    assert sorted(table.index) == sorted(first)
    genders = {"1": "female", "2": "male"}
    ethnicities = {"0": "other/unknown", "1": "asian", "2": "african american",
                   "3": "caucasian", "4": "hispanic", "5": "native american"}  # fmt: skip
    for stay, row in first.items():
        assert table.loc[stay, "gender"] == genders[row["gender"]]
        assert table.loc[stay, "ethnicity"] == ethnicities[row["ethnicity"]]
        assert table.loc[stay, "age"] == float(row["age"])


def edit(path: Path, line: int, column: str, value: str) -> None:
    rows = list(csv.reader(path.open(newline="")))
    rows[line - 1][rows[0].index(column)] = value
    with path.open("w", newline="") as handle:
        csv.writer(handle, lineterminator="\n").writerows(rows)


def drop_column(path: Path, column: str) -> None:
    rows = list(csv.reader(path.open(newline="")))
    index = rows[0].index(column)
    with path.open("w", newline="") as handle:
        csv.writer(handle, lineterminator="\n").writerows(r[:index] + r[index + 1 :] for r in rows)


def first_subject(root: Path) -> Path:
    return sorted((root / "train").iterdir())[0]


BROKEN_MIMIC3 = {
    "stays.csv without ETHNICITY": (
        lambda r: drop_column(first_subject(r) / "stays.csv", "ETHNICITY"),
        r"stays.csv: line 1: missing column 'ETHNICITY'",
    ),
    "non-numeric AGE": (
        lambda r: edit(first_subject(r) / "stays.csv", 2, "AGE", "old"),
        r"stays.csv: line 2: AGE must be a number, got 'old'",
    ),
    "fractional ICUSTAY_ID": (
        lambda r: edit(first_subject(r) / "stays.csv", 2, "ICUSTAY_ID", "2.5"),
        r"stays.csv: line 2: ICUSTAY_ID must be a whole number, got '2.5'",
    ),
    "ragged stays row": (
        lambda r: (first_subject(r) / "stays.csv").write_text(
            "ICUSTAY_ID,GENDER,AGE,ETHNICITY\n1,F\n"
        ),
        r"stays.csv: line 2: expected 4 fields, got 2",
    ),
    "episode without Icustay": (
        lambda r: drop_column(first_subject(r) / "episode1.csv", "Icustay"),
        r"episode1.csv: line 1: missing column 'Icustay'",
    ),
    "empty episode": (
        lambda r: (first_subject(r) / "episode1.csv").write_text("Icustay,Age\n"),
        r"episode1.csv: line 2: no row after the header",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN_MIMIC3))
def test_a_malformed_mimic3_attribute_file_is_one_line_naming_file_and_field(
    mimic3, tmp_path, case
):
    root = shutil.copytree(mimic3 / "root", tmp_path / "root")
    corrupt, pattern = BROKEN_MIMIC3[case]
    corrupt(root)
    with pytest.raises(UserError) as raised:
        read_mimic3_attributes(root, stays_of(mimic3))
    assert "\n" not in str(raised.value) and str(root) in str(raised.value)
    assert re.search(pattern, str(raised.value)), str(raised.value)


BROKEN_EICU = {
    "no ethnicity column": (
        lambda f: drop_column(f / "all_data.csv", "ethnicity"),
        r"all_data.csv: line 1: missing column 'ethnicity'",
    ),
    "unknown ethnicity code": (
        lambda f: edit(f / "all_data.csv", 3, "ethnicity", "7"),
        r"all_data.csv: line 3: ethnicity must be one of the benchmark's codes \[0, 1, 2, 3, 4, 5",
    ),
    "text gender": (
        lambda f: edit(f / "all_data.csv", 4, "gender", "Female"),
        r"all_data.csv: line 4: column 'gender' must be a number, got 'Female'",
    ),
    "unknown gender code": (
        lambda f: edit(f / "all_data.csv", 2, "gender", "3"),
        r"all_data.csv: line 2: gender must be one of the benchmark's codes \[0, 1, 2\]",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN_EICU))
def test_a_malformed_eicu_attribute_column_is_one_line_naming_file_and_field(tmp_path, case):
    folder = write_synthetic_eicu(tmp_path / "eicu", patients=4, seed=0)
    corrupt, pattern = BROKEN_EICU[case]
    corrupt(folder)
    with pytest.raises(UserError) as raised:
        read_eicu_attributes(folder)
    assert "\n" not in str(raised.value) and str(folder) in str(raised.value)
    assert re.search(pattern, str(raised.value)), str(raised.value)


def test_an_empty_ethnicity_is_the_unknown_group(tmp_path):
    folder = write_synthetic_eicu(tmp_path / "eicu", patients=3, seed=0)
    path = folder / "all_data.csv"
    stay = next(csv.DictReader(path.open()))["patientunitstayid"]
    rows = list(csv.reader(path.open(newline="")))
    column, stay_column = rows[0].index("ethnicity"), rows[0].index("patientunitstayid")
    for row in rows[1:]:
        if row[stay_column] == stay:
            row[column] = ""
    with path.open("w", newline="") as handle:
        csv.writer(handle, lineterminator="\n").writerows(rows)
    assert read_eicu_attributes(folder).set_index("stay").loc[stay, "ethnicity"] == UNKNOWN


# --- the report -------------------------------------------------------------------------


def report(capsys, *argv: str) -> tuple[int, str]:
    status = relif(["report", *argv, "--n-boot", "0", "--no-figures", "--pairs", "64"])
    return status, capsys.readouterr().err


def test_the_report_says_in_one_line_why_mimic3_has_no_group_audit(tmp_path, capsys):
    experiment = write_synthetic_experiment(
        tmp_path / "m", labels=("erm",), seeds=1, dataset="mimic3", n_examples=8
    )
    status, _ = report(capsys, str(experiment), "--out", str(tmp_path / "out"))
    assert status == 0
    text = (tmp_path / "out" / "report.md").read_text()
    section = text[text.index("## Group fairness") :].splitlines()
    assert section[1].startswith("Skipped: mimic3: no attribute folder given; the attributes are "
                                 "in the benchmark's per-subject root/ folder")  # fmt: skip
    assert section[2:4] == ["", "## Trials without outputs"]


def test_a_malformed_attribute_file_stops_the_report_in_one_line(tmp_path, capsys):
    experiment = write_synthetic_experiment(
        tmp_path / "e", labels=("erm",), seeds=1, dataset="eicu", n_examples=6
    )
    folder = write_synthetic_eicu(tmp_path / "eicu", patients=6, seed=0)
    edit(folder / "all_data.csv", 5, "ethnicity", "9")
    out = tmp_path / "out"
    status, err = report(capsys, str(experiment), "--out", str(out), "--attributes", str(folder))
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0] == (
        f"relif: error: {folder / 'all_data.csv'}: line 5: ethnicity must be one of the "
        "benchmark's codes [0, 1, 2, 3, 4, 5]"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        (
            "--long-stay-hours",
            "100",
            "--long-stay-hours: must be a length-of-stay bin edge (24, 48, 72, 96, 120, 144, "
            "168, 192, 336), got 100",
        ),
        ("--group-threshold", "1", "--group-threshold: must be in (0, 1), got 1"),
        ("--age-bands", "65,45", "--age-bands: need increasing finite ages, got [65.0, 45.0]"),
        ("--min-group-size", "0", "--min-group-size: must be >= 1, got 0"),
    ],
)
def test_a_bad_group_option_is_one_line_before_anything_is_read(capsys, flag, value, message):
    status, err = report(capsys, "nowhere", "--out", "nowhere-report", flag, value)
    assert status == 2 and err.strip().splitlines() == [f"relif: error: {message}"], err


def test_multiclass_and_regression_groups_against_a_direct_count():
    """A table's multiclass and regression tasks per group (`task_groups`): error rate and
    predicted shares, MAE and mean prediction, and the gaps over the groups of at least
    `min_group_size` rows, against numpy on the same rows."""
    from sklearn.metrics import accuracy_score, mean_absolute_error

    from relif_ray.analysis.groups import GroupOptions, task_groups

    options = GroupOptions(min_group_size=10)

    rng = np.random.default_rng(3)
    groups = np.array(["a"] * 60 + ["b"] * 50 + ["c"] * 5)  # c is small: not compared
    labels = rng.integers(0, 3, groups.size)
    predicted = np.where(rng.random(groups.size) < 0.6, labels, rng.integers(0, 3, groups.size))
    rows = pd.DataFrame(
        {"label": labels, "prediction": predicted, "example_id": np.arange(groups.size)}
    )
    per_group, gaps = task_groups(rows, "multiclass", groups, options)
    frame = per_group.set_index("group")
    for group in ("a", "b", "c"):
        mine = groups == group
        accuracy = accuracy_score(labels[mine], predicted[mine])
        assert frame.loc[group, "value"] == pytest.approx(1 - accuracy)
        for k in range(3):
            assert frame.loc[group, f"share_{k}"] == pytest.approx(np.mean(predicted[mine] == k))
    assert frame["small"].tolist() == [False, False, True]
    assert gaps["compared"] == 2
    assert gaps["error_gap"] == pytest.approx(
        abs(frame.loc["a", "value"] - frame.loc["b", "value"])
    )
    share_gaps = [
        abs(frame.loc["a", f"share_{k}"] - frame.loc["b", f"share_{k}"]) for k in range(3)
    ]
    assert gaps["prediction_gap"] == pytest.approx(max(share_gaps))

    values = rng.normal(100, 20, groups.size)
    guesses = values + rng.normal(5 * (groups == "b"), 10)
    rows = pd.DataFrame(
        {"label": values, "prediction": guesses, "example_id": np.arange(groups.size)}
    )
    per_group, gaps = task_groups(rows, "regression", groups, options)
    frame = per_group.set_index("group")
    mae = {g: mean_absolute_error(values[groups == g], guesses[groups == g]) for g in "abc"}
    mean = {g: np.mean(guesses[groups == g]) for g in "abc"}
    assert frame["value"].to_dict() == pytest.approx(mae)
    assert frame["mean_prediction"].to_dict() == pytest.approx(mean)
    assert gaps["error_gap"] == pytest.approx(abs(mae["a"] - mae["b"]))
    assert gaps["prediction_gap"] == pytest.approx(abs(mean["a"] - mean["b"]))
    assert gaps["overall"] == pytest.approx(np.mean(np.abs(values - guesses)))
    _, alone = task_groups(rows[groups == "a"], "regression", groups[groups == "a"], options)
    assert np.isnan(alone["error_gap"]) and np.isnan(alone["prediction_gap"])
