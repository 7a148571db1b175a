"""The tabular benchmark without Ray: the spec, the split, the encoding fitted on the training
split only, the tasks' metrics against scikit-learn, label masks, and every bad input of
`sweeps/tabular.py` as one line that writes nothing."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.impute import SimpleImputer
from sklearn.metrics import accuracy_score, mean_absolute_error, mean_squared_error, roc_auc_score
from sklearn.preprocessing import StandardScaler

from relif_ray.cli.sweep import main
from relif_ray.cli.tabular import SOURCE
from relif_ray.data import actg175
from relif_ray.data.synthetic_tabular import DEMO_SPEC, TABLE, write_synthetic_table
from relif_ray.data.table_spec import TableSpec
from relif_ray.data.tabular import MISSING_LEVEL, load_table
from relif_ray.problems import benchmark, use_spec
from relif_ray.tasks.tabular import MulticlassTask, RegressionTask
from tests.test_bad_inputs import one_line

REPO = Path(__file__).resolve().parents[1]
SPEC = TableSpec.from_dict(DEMO_SPEC)


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    """The synthetic table (600 rows, a few missing cells and labels)."""
    return (
        write_synthetic_table(tmp_path_factory.mktemp("table") / "data", rows=600, seed=0) / TABLE
    )


DIGEST = """
import hashlib, json, sys
from relif_ray.data.table_spec import TableSpec
from relif_ray.data.tabular import load_table
rows = load_table(sys.argv[1], TableSpec.from_dict(json.loads(sys.argv[2]))).rows
text = ";".join(f"{split}:{','.join(map(str, rows[split]))}" for split in sorted(rows))
print(hashlib.sha256(text.encode()).hexdigest())
"""
"""The split's digest, in a process that imports the reader alone."""


def split_digest(path: Path) -> str:
    rows = load_table(path, SPEC).rows
    text = ";".join(f"{split}:{','.join(map(str, rows[split]))}" for split in sorted(rows))
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_split_is_the_same_in_another_process_and_stratified(table: Path) -> None:
    other = subprocess.run(
        [sys.executable, "-c", DIGEST, str(table), json.dumps(DEMO_SPEC)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert other.stdout.strip() == split_digest(table)
    data = load_table(table, SPEC)
    sizes = {split: len(rows) for split, rows in data.rows.items()}
    assert sum(sizes.values()) == 600 and sizes["val"] == sizes["test"] == pytest.approx(90, abs=3)
    labels = pd.read_csv(table)["event"]
    for rows in data.rows.values():  # the first task's classes in the table's proportion
        assert labels.iloc[rows].mean() == pytest.approx(labels.mean(), abs=0.02)
        assert labels.iloc[rows].isna().mean() == pytest.approx(labels.isna().mean(), abs=0.02)
    other_seed = TableSpec.from_dict({**DEMO_SPEC, "data_seed": 1})
    assert not np.array_equal(load_table(table, other_seed).rows["val"], data.rows["val"])


def test_imputation_and_encoding_are_fitted_on_the_training_split_only(
    table: Path, tmp_path: Path
) -> None:
    """The encoding agrees with scikit-learn's imputer and scaler fitted on the training rows,
    and rewriting every other row (values, missing cells, new levels) changes nothing of it."""
    data = load_table(table, SPEC)
    frame = pd.read_csv(table)
    train, val = frame.iloc[data.rows["train"]], frame.iloc[data.rows["val"]]
    numeric = ["x1", "x2", "x3", "x4"]
    imputer = SimpleImputer(strategy="median").fit(train[numeric])
    scaler = StandardScaler().fit(imputer.transform(train[numeric]))
    names = data.encoder.names
    for split, rows in (("train", train), ("val", val)):
        expected = scaler.transform(imputer.transform(rows[numeric]))
        found = data.features[split][:, [names.index(c) for c in numeric]]
        np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-5)
        indicator = data.features[split][:, names.index("x2_missing")]
        np.testing.assert_array_equal(indicator, rows["x2"].isna().to_numpy())
        site = data.features[split][:, names.index(f"site={MISSING_LEVEL}")]
        np.testing.assert_array_equal(site, rows["site"].isna().to_numpy())
    assert data.imputed["x2"] == {
        s: int(frame["x2"].iloc[data.rows[s]].isna().sum()) for s in data.rows
    }

    changed = frame.copy()
    others = np.concatenate([data.rows["val"], data.rows["test"]])
    changed.loc[others, numeric] = changed.loc[others, numeric] * 100 + 1000
    changed.loc[others[:20], "x1"] = np.nan
    changed.loc[others, "site"] = "unseen"
    (tmp_path / "changed").mkdir()
    changed.to_csv(tmp_path / "changed" / TABLE, index=False)
    again = load_table(tmp_path / "changed" / TABLE, SPEC)
    np.testing.assert_array_equal(again.rows["train"], data.rows["train"])
    assert again.encoder == data.encoder
    np.testing.assert_array_equal(again.features["train"], data.features["train"])
    assert not np.allclose(again.features["val"], data.features["val"])
    assert again.features["val"][:, [n.startswith("site=") for n in names]].sum() == 0


def test_multiclass_and_regression_metrics_agree_with_scikit_learn() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 3, generator=generator)
    classes = torch.randint(0, 3, (200,), generator=generator).float()
    mask = (torch.rand(200, generator=generator) > 0.1).float()
    task = MulticlassTask("stage", 3)
    metrics = task.new_metrics()
    for part in torch.split(torch.arange(200), 64):  # batch by batch, as an evaluation
        metrics.update(logits[part], torch.stack([mask, classes], 1)[part])
    found = metrics.compute()
    keep = mask.bool().numpy()
    probabilities = torch.softmax(logits.double(), 1).numpy()[keep]
    truth = classes.numpy()[keep]
    assert found["auroc_macro"] == pytest.approx(
        roc_auc_score(truth, probabilities, multi_class="ovr", average="macro"), abs=1e-12
    )
    assert found["accuracy"] == pytest.approx(accuracy_score(truth, probabilities.argmax(1)))

    values = torch.randn(200, generator=generator) * 30 + 400
    predictions = torch.randn(200, generator=generator)
    regression = RegressionTask("cd4", mean=400.0, std=30.0)
    metrics = regression.new_metrics()
    metrics.update(predictions, torch.stack([mask, values], 1))
    found = metrics.compute()
    predicted = (predictions.double().numpy() * 30 + 400)[keep]
    assert found["mae"] == pytest.approx(
        mean_absolute_error(values.numpy()[keep], predicted), rel=1e-6
    )
    rmse = np.sqrt(mean_squared_error(values.numpy()[keep], predicted))
    assert found["rmse"] == pytest.approx(rmse, rel=1e-6)
    assert regression.normalized_score(found) == pytest.approx(1 / (1 + rmse / 30), rel=1e-6)


def test_a_missing_label_masks_its_task_for_that_row_only(table: Path) -> None:
    use_spec({"dataset": "tabular", "spec": DEMO_SPEC})
    problem = benchmark("tabular").load(str(table.parent))
    batch = problem.splits["train"].batch(torch.arange(len(problem.splits["train"])))
    frame = pd.read_csv(table).iloc[load_table(table, SPEC).rows["train"]]
    for task in problem.tasks:
        mask = batch[task.name][:, 0].numpy().astype(bool)
        np.testing.assert_array_equal(mask, frame[task.name].notna().to_numpy())
    score = problem.tasks[2]  # regression: the loss is over the labelled rows alone
    prediction = torch.randn(len(mask))
    target = batch[score.name]
    labelled = target[:, 0] > 0
    alone = score.loss(prediction[labelled], target[labelled])
    assert score.loss(prediction, target).item() == pytest.approx(alone.item(), rel=1e-6)
    assert benchmark("tabular").squashed_tasks == {"score"}


def test_the_actg175_preset_uses_no_post_baseline_column_and_has_three_kinds() -> None:
    spec = TableSpec.from_dict(actg175.SPEC)
    assert {task.kind for task in spec.tasks} == {"binary", "multiclass", "regression"}
    assert not set(spec.features) & set(actg175.POST_BASELINE)
    assert {task.column for task in spec.tasks} <= set(actg175.POST_BASELINE)
    assert {group.column for group in spec.groups} == {"race", "gender", "age"}


# Bad input: one line, exit 2, nothing written ---------------------------------------------


def sweep(argv: list[str]) -> int:
    return main(argv, datasets=("tabular",), controller_checks=False, source=SOURCE)


def bad_files(folder: Path, table: Path) -> dict[str, Path]:
    frame = pd.read_csv(table)
    files = {"empty": folder / "empty.csv", "garbage": folder / "garbage.parquet"}
    files["empty"].write_text("")
    files["garbage"].write_bytes(b"PAR1 not really")
    frame.assign(site="a").to_csv(folder / "one_site.csv", index=False)
    frame.assign(score=np.nan).to_csv(folder / "no_score.csv", index=False)
    files["one_site"], files["no_score"] = folder / "one_site.csv", folder / "no_score.csv"
    (folder / "spec.yaml").write_text(f"data: {table}\ntasks: [event=event:binary]\nlabel: x\n")
    files["spec"] = folder / "spec.yaml"
    return files


BAD = {
    "missing column": (["--task", "death=died:binary"], "no column 'died' (named as task death)"),
    "binary with three values": (
        ["--task", "stage=stage:binary"],
        "task stage: a binary column needs exactly two values, 'stage' has 3 (0, 1, 2)",
    ),
    "unknown kind": (["--task", "stage=stage:ordinal"], "--task stage: unknown kind 'ordinal'"),
    "empty file": (["--data", "{empty}", "--task", "e=event:binary"], "empty.csv: empty file"),
    "unreadable file": (
        ["--data", "{garbage}", "--task", "e=event:binary"],
        "garbage.parquet: not a readable table",
    ),
    "task also a feature": (
        ["--task", "e=event:binary", "--feature", "event"],
        "column 'event' is task e's label and cannot also be a feature",
    ),
    "task also a group": (
        ["--task", "e=event:binary", "--group", "event"],
        "column 'event' is task e's label and cannot also be a group",
    ),
    "group of one value": (
        ["--data", "{one_site}", "--task", "e=event:binary", "--group", "site"],
        "group column 'site' has one value only",
    ),
    "spec with an unknown key": (["--spec", "{spec}"], "spec.yaml: unknown key 'label'"),
    "labels all missing": (
        ["--data", "{no_score}", "--task", "s=score:regression"],
        "task s: every label in column 'score' is missing",
    ),
    "text that is not a number": (
        ["--task", "s=site:regression"],
        "column 'site' (task s, regression) must hold numbers; row 1 has 'a'",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_writes_nothing(case, table, tmp_path, capsys, no_sweep):
    files = bad_files(tmp_path, table)
    flags, message = BAD[case]
    flags = [flag.format(**files) for flag in flags]
    if "--data" not in flags and "--spec" not in flags:
        flags = ["--data", str(table), *flags]
    storage = tmp_path / "results"
    one_line(sweep([*flags, "--storage", str(storage)]), capsys, message)
    assert not storage.exists()


def test_the_preset_without_lifelines_says_what_to_install(tmp_path, capsys, monkeypatch, no_sweep):
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "lifelines" else found(name, *a),
    )
    status = sweep(["--preset", "actg175", "--storage", str(tmp_path / "results")])
    one_line(status, capsys, "--preset actg175:", "pip install lifelines")
    assert not (tmp_path / "results").exists()


def test_trials_of_different_specs_are_not_reported_together() -> None:
    from relif_ray.analysis.experiment import _one_spec
    from relif_ray.errors import UserError

    def row(tasks: list[str], path: str) -> dict:
        spec = TableSpec.from_dict({"tasks": tasks}).to_dict()
        return {"path": path, "config": {"data": {"dataset": "tabular", "spec": spec}}}

    _one_spec([row(["e=event:binary"], "a"), row(["e=event:binary"], "b")])
    with pytest.raises(UserError, match="^c: its tabular tasks differ from those of a;"):
        _one_spec([row(["e=event:binary"], "a"), row(["e=stage:multiclass"], "c")])
