"""eICU in the layout of the eICU benchmark of Sheikhalishahi, Balaraman and Osmani (2020).

Source: "Benchmarking machine learning models on multi-centre eICU critical care dataset",
PLOS ONE 15(7): e0235424, code at github.com/mostafaalishahi/eICU_Benchmark (also
eICU_Benchmark_updated). Its extraction script (`data_extraction_root.py`) writes one folder
per ICU unit stay with an hourly `timeseries.csv` and concatenates them all into
`all_data.csv`, the file its task code reads. Its tasks include in-hospital mortality from the
first 48 hours and remaining length of stay at every charted hour - the two eICU tasks of the
paper. This reader takes the extraction output folder as `root`:

    root/all_data.csv   one row per stay and charted hour; columns are found by NAME:
        patientunitstayid        the ICU unit stay
        itemoffset               hour since unit admission (int(minutes / 60))
        glucose, Invasive BP Diastolic, Invasive BP Systolic, O2 Saturation,
        Respiratory Rate, Motor, Eyes, MAP (mmHg), Heart Rate, GCS Total, Verbal, pH,
        FiO2, Temperature (C)                    the 14 hourly variables
        admissionheight, admissionweight, age, gender   static, repeated on every row
        hospitaldischargestatus  1 died in hospital, 0 alive, 2 unknown
        unitdischargeoffset      minutes from unit admission to unit discharge
        ethnicity                read only for the group audit (`read_eicu_attributes`)
      (other columns the benchmark writes - apacheadmissiondx, ... - are ignored)
    root/splits.csv     optional: patientunitstayid,split with split in train/val/test

The benchmark evaluates by 5-fold cross-validation and ships no fixed split. Without
`splits.csv` the stays (sorted by id) are split by a fixed random permutation (seed 0): 15%
test, 15% validation, 70% training.

Tasks, following the benchmark's task filters (rows with itemoffset > 0, remaining stay > 0):

* hourly steps k = 1, 2, ... (step k - 1) for the hours with 60 k < unitdischargeoffset; a
  stay's sequence runs to its last charted hour, or to hour 48 if that is later and the stay
  lasts beyond it. Stays without a charted hour in that range are left out, as the
  benchmark's filters leave them out;
* mortality: label hospitaldischargestatus, read at hour 48; labelled (mask 1) when the stay
  lasts more than 48 hours and the status is known (benchmark: stays of >= 2 days);
* length_of_stay: remaining stay unitdischargeoffset / 60 - k hours at every CHARTED hour k
  (the benchmark's RLOS samples), classified into the same 10 bins as MIMIC-III.

Features per step (19): the 14 variables and 4 static values, standardised with the mean and
sample std over all steps of the training stays, and a charted flag (1 if the hour has a row).
An hour without a row, or an empty cell, carries the previous value forward; before the first
value it takes the benchmark imputer's normal value. age and gender have no normal value and
must be present. ethnicity and the ~400-level admission diagnosis are nominal codes and are
not features; gender, age and ethnicity are the sensitive attributes of the group audit
(`read_eicu_attributes`).

Input problems raise a one-line `UserError` naming the file and line.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from relif_ray.data.attributes import ATTRIBUTE_COLUMNS, UNKNOWN
from relif_ray.data.cells import as_numbers
from relif_ray.data.sequences import SequenceSplit, Standardizer, build_split, carry_forward
from relif_ray.errors import UserError, first_line

MORTALITY_HOURS = 48

TIME_VARYING_NORMALS: dict[str, float] = {
    "glucose": 128.0,
    "Invasive BP Diastolic": 56.0,
    "Invasive BP Systolic": 118.0,
    "O2 Saturation": 98.0,
    "Respiratory Rate": 19.0,
    "Motor": 6.0,
    "Eyes": 4.0,
    "MAP (mmHg)": 77.0,
    "Heart Rate": 86.0,
    "GCS Total": 15.0,
    "Verbal": 5.0,
    "pH": 7.4,
    "FiO2": 0.21,
    "Temperature (C)": 36.0,
}
"""The 14 hourly variables and the benchmark imputer's normal values for them."""

STATIC_NORMALS: dict[str, float] = {"admissionheight": 170.0, "admissionweight": 81.0}
"""Static values with a normal value in the benchmark's imputer."""

STATIC_REQUIRED = ("age", "gender")
"""Static values without a normal value: every row needs them."""

FEATURE_COLUMNS: tuple[str, ...] = (*TIME_VARYING_NORMALS, *STATIC_NORMALS, *STATIC_REQUIRED)
FEATURE_NAMES = (*FEATURE_COLUMNS, "charted")
NUM_FEATURES = len(FEATURE_NAMES)
STANDARDIZED_COLUMNS = list(range(len(FEATURE_COLUMNS)))

ID_COLUMNS = ("patientunitstayid", "itemoffset", "hospitaldischargestatus", "unitdischargeoffset")
REQUIRED_COLUMNS = (*ID_COLUMNS, *FEATURE_COLUMNS)
SPLITS = ("train", "val", "test")


def read_all_data(path: Path) -> pd.DataFrame:
    """The required columns of all_data.csv as floats (NaN = empty cell), validated."""
    table = _numeric_columns(path, REQUIRED_COLUMNS)
    for column in (*ID_COLUMNS, *STATIC_REQUIRED):
        _check(table[column].notna(), path, f"missing value in column '{column}'")
    for column in ("patientunitstayid", "itemoffset"):
        _check(table[column] == np.floor(table[column]), path, f"'{column}' must be a whole number")
    _check(
        table["hospitaldischargestatus"].isin([0, 1, 2]),
        path,
        "hospitaldischargestatus must be 0, 1 or 2",
    )
    return table


def _numeric_columns(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """`columns` of all_data.csv as floats (NaN = empty cell).

    pandas' C parser reads the numbers; a column that does not parse as numbers is searched
    for its first bad cell, so the error names the line.
    """
    if not path.is_file():
        raise UserError(f"{path}: not found (the eICU benchmark's all_data.csv)")
    try:
        header = pd.read_csv(path, nrows=0).columns
        missing = [column for column in columns if column not in header]
        if missing:
            raise UserError(f"{path}: line 1: missing column '{missing[0]}'")
        raw = pd.read_csv(path, usecols=list(columns), low_memory=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        reason = first_line(error, fallback="unreadable")
        raise UserError(f"{path}: not a readable CSV file: {reason}") from None
    if raw.empty:
        raise UserError(f"{path}: line 2: no rows after the header")
    return pd.DataFrame({column: _numbers(raw[column], path) for column in columns})


def _numbers(cells: pd.Series, path: Path) -> pd.Series:
    values, row = as_numbers(cells)
    if row is not None:
        raise UserError(
            f"{path}: line {row + 2}: column '{cells.name}' must be a number, "
            f"got '{cells.iloc[row]}'"
        )
    return values


def _check(ok: pd.Series, path: Path, message: str) -> None:
    if not ok.all():
        raise UserError(f"{path}: line {int(np.flatnonzero(~ok.to_numpy())[0]) + 2}: {message}")


def read_splits(root: Path, stay_ids: np.ndarray, all_data: Path) -> dict[int, str]:
    """Stay id -> split, from root/splits.csv or the default seeded 70/15/15 split."""
    path = root / "splits.csv"
    unique_ids = np.unique(stay_ids)
    if not path.is_file():
        order = np.random.default_rng(0).permutation(len(unique_ids))
        n_test = n_val = max(1, round(0.15 * len(unique_ids)))
        names = np.array(["train"] * len(unique_ids), dtype=object)
        names[order[:n_test]] = "test"
        names[order[n_test : n_test + n_val]] = "val"
        return {int(i): str(split) for i, split in zip(unique_ids, names, strict=True)}
    split_of: dict[int, str] = {}
    with open(path) as handle:
        lines = handle.read().splitlines()
    if not lines or lines[0].split(",") != ["patientunitstayid", "split"]:
        raise UserError(f"{path}: line 1: header must be 'patientunitstayid,split'")
    for line_number, text in enumerate(lines[1:], 2):
        fields = text.split(",")
        if len(fields) != 2 or not fields[0].strip().isdigit() or fields[1] not in SPLITS:
            raise UserError(
                f"{path}: line {line_number}: expected '<stay id>,train|val|test', got '{text}'"
            )
        split_of[int(fields[0])] = fields[1]
    for stay in unique_ids:
        if int(stay) not in split_of:
            row = int(np.flatnonzero(stay_ids == stay)[0]) + 2
            raise UserError(f"{path}: no split for stay {int(stay)} ({all_data} line {row})")
    return split_of


StayArrays = tuple[np.ndarray, np.ndarray, np.ndarray]
"""features (steps, 19), mortality (2,) = (mask, label), length_of_stay (steps, 2)."""


def charted_inside(hours: np.ndarray, discharge_minutes: np.ndarray | float) -> np.ndarray:
    """Which charted hours k fall inside the unit stay: 1 <= k < discharge / 60 hours."""
    last_hour = np.ceil(np.asarray(discharge_minutes) / 60.0) - 1
    return (hours >= 1) & (hours <= last_hour)


def stay_arrays(rows: dict[str, np.ndarray]) -> StayArrays | None:
    """The arrays of one stay from its rows (column -> values in file order), or None when
    the stay has no charted hour inside its unit stay."""
    discharge_hours = rows["unitdischargeoffset"][0] / 60.0
    last_hour = math.ceil(discharge_hours) - 1  # the hours k with k < discharge_hours
    hours = rows["itemoffset"].astype(np.int64)
    inside = charted_inside(hours, rows["unitdischargeoffset"][0])
    if not inside.any():
        return None
    steps = min(last_hour, max(int(hours[inside].max()), MORTALITY_HOURS))
    features = np.zeros((steps, NUM_FEATURES))
    for column, (name, normal) in enumerate(TIME_VARYING_NORMALS.items()):
        values = rows[name][inside]
        present = ~np.isnan(values)
        _, features[:, column] = carry_forward(
            hours[inside][present] - 1, values[present], steps, normal
        )
    for column, name in enumerate((*STATIC_NORMALS, *STATIC_REQUIRED), len(TIME_VARYING_NORMALS)):
        given = rows[name][~np.isnan(rows[name])]
        features[:, column] = given[0] if len(given) else STATIC_NORMALS[name]
    charted = np.zeros(steps)
    charted[hours[inside] - 1] = 1.0
    features[:, -1] = charted
    status = int(rows["hospitaldischargestatus"][0])
    mortality_mask = float(steps >= MORTALITY_HOURS and status != 2)
    mortality = np.array([mortality_mask, float(status == 1) * mortality_mask])
    remaining_hours = discharge_hours - np.arange(1, steps + 1)
    length_of_stay = np.stack([charted, charted * remaining_hours], axis=1)
    return features, mortality, length_of_stay


def check_eicu(root: str | Path) -> None:
    """Check an eICU folder as `read_eicu` would, short of building the stays' arrays:
    all_data.csv parsed whole (columns, numbers, required values, discharge status),
    splits.csv, and a usable stay (a charted hour inside the unit stay) in every split."""
    root = Path(root)
    path = root / "all_data.csv"
    table = read_all_data(path)
    stay_ids = table["patientunitstayid"].to_numpy().astype(np.int64)
    split_of = read_splits(root, stay_ids, path)
    discharge = table.groupby("patientunitstayid")["unitdischargeoffset"].transform("first")
    inside = charted_inside(table["itemoffset"].to_numpy(), discharge.to_numpy())
    usable_splits = {split_of[int(stay)] for stay in np.unique(stay_ids[inside])}
    for split in SPLITS:
        if split not in usable_splits:
            raise UserError(f"{path}: no usable stay in the {split} split")


def read_eicu(root: str | Path) -> tuple[dict[str, SequenceSplit], Standardizer]:
    """The train/val/test splits of an eICU benchmark folder and the training statistics."""
    root = Path(root)
    path = root / "all_data.csv"
    table = read_all_data(path)
    stay_ids = table["patientunitstayid"].to_numpy().astype(np.int64)
    split_of = read_splits(root, stay_ids, path)
    order = np.argsort(stay_ids, kind="stable")
    columns = {name: table[name].to_numpy()[order] for name in REQUIRED_COLUMNS}
    sorted_ids = stay_ids[order]
    starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
    ends = np.r_[starts[1:], len(sorted_ids)]
    stays: dict[str, list[tuple[str, StayArrays]]] = {split: [] for split in SPLITS}
    for start, end in zip(starts, ends, strict=True):
        arrays = stay_arrays({name: values[start:end] for name, values in columns.items()})
        if arrays is not None:
            stay = int(sorted_ids[start])
            stays[split_of[stay]].append((str(stay), arrays))
    for split, members in stays.items():
        if not members:
            raise UserError(f"{path}: no usable stay in the {split} split")
    train_features = [arrays[0] for _, arrays in stays["train"]]
    standardizer = Standardizer.fit(train_features, STANDARDIZED_COLUMNS)
    splits = {
        split: build_split(
            stays=[standardizer.apply(arrays[0]) for _, arrays in members],
            stay_targets={"mortality": np.stack([arrays[1] for _, arrays in members])},
            step_targets={"length_of_stay": [arrays[2] for _, arrays in members]},
            names=[name for name, _ in members],
        )
        for split, members in stays.items()
    }
    return splits, standardizer


GENDERS = {1: "female", 2: "male", 0: "other/unknown"}
"""The eICU benchmark's gender codes (its `transform_gender`: Female 1, Male 2, and 0 for
Unknown, Other and empty alike)."""
ETHNICITIES = {
    1: "asian",
    2: "african american",
    3: "caucasian",
    4: "hispanic",
    5: "native american",
    0: "other/unknown",
}
"""The eICU benchmark's ethnicity codes (its `transform_ethnicity`; 0 for Other/Unknown and
empty alike)."""
ATTRIBUTE_SOURCE_COLUMNS = ("patientunitstayid", "gender", "age", "ethnicity")


def read_eicu_attributes(root: str | Path, stays: Iterable[str] = ()) -> pd.DataFrame:
    """One row (`relif_ray.data.attributes.ATTRIBUTE_COLUMNS`) per stay of all_data.csv, from
    its first row: gender and ethnicity by the benchmark's codes (`GENDERS`, `ETHNICITIES`;
    an empty ethnicity cell is `UNKNOWN`), age in years. Every stay is read; `stays` (the
    stays an audit asks for) is accepted for the common signature and not needed. A code the
    benchmark does not write is a one-line error naming the line."""
    path = Path(root) / "all_data.csv"
    table = _numeric_columns(path, ATTRIBUTE_SOURCE_COLUMNS)
    _check(table["patientunitstayid"].notna(), path, "missing value in column 'patientunitstayid'")
    for column, codes in (("gender", GENDERS), ("ethnicity", ETHNICITIES)):
        empty_allowed = column == "ethnicity"  # gender is a feature: never empty
        known = table[column].isin(list(codes)) | (empty_allowed & table[column].isna())
        _check(known, path, f"{column} must be one of the benchmark's codes {sorted(codes)}")
    first = table.drop_duplicates("patientunitstayid")
    return pd.DataFrame(
        {
            "stay": [str(int(stay)) for stay in first["patientunitstayid"]],
            "gender": first["gender"].map(GENDERS).to_numpy(),
            "age": first["age"].to_numpy(dtype=np.float64),
            "ethnicity": first["ethnicity"].map(ETHNICITIES).fillna(UNKNOWN).to_numpy(),
        },
        columns=list(ATTRIBUTE_COLUMNS),
    )
