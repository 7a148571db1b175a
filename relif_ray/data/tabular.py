"""Any table (CSV or parquet) as a multi-task problem: the reader, the split and the encoding.

A `TableSpec` (`relif_ray.data.table_spec`) says what the table means. Labels: binary, exactly
two distinct values, the larger (in sort order) the positive class; multiclass, the classes
are the distinct values in sort order; regression, numbers. Groups: a column's values as text,
or the bands of a banded numeric column (`age:30,40` gives <30, [30, 40), >=40).

Splits are stratified on the first task (its class; for a regression task its quintile over
the whole table; a missing label is a stratum of its own): within each stratum, in the order
of the table's rows, a permutation drawn from numpy's PCG64 generator seeded with `data_seed`
puts the first round(n * test) rows in test and the next round(n * val) in val. The same table
and spec give the same splits on every machine.

Encoding, with statistics from the TRAINING split only (`Encoder.fit`): a feature is numeric
where the table stores it as numbers, else categorical. Numeric: a missing value takes the
training median (0 where training has none), plus a 0/1 missing-indicator column where the
training split has a missing value; then standardised with the training mean and population
std (std 0: divided by 1). Categorical: one-hot over the training split's levels, a missing
value being the level `MISSING_LEVEL` of its own; a level training never saw is all zeros.
Missing cells are counted per feature and split (`TableData.imputed`).

Labels: a missing label masks that task for that row only; every target is (mask, value) per
row: the label 0/1, the class index, or the value in the column's own units.

Every problem with the input is a one-line `UserError` naming the file or the spec field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from relif_ray.data.attributes import UNKNOWN, band_names
from relif_ray.data.cells import as_numbers
from relif_ray.data.table_spec import (
    GroupColumn,
    TableSpec,
    TaskColumn,
)
from relif_ray.errors import UserError, first_line

SPLITS = ("train", "val", "test")
MISSING_LEVEL = "(missing)"
"""The level of a missing categorical value."""
REGRESSION_STRATA = 5
"""A regression task stratifies the split by its quintiles."""


# ----------------------------------------------------------------------------------------
# Reading


def read_table(path: str | Path) -> pd.DataFrame:
    """The table at `path` (.csv, or .parquet/.pq), columns by name; a one-line error for a
    missing, empty or unreadable file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file (the data table)")
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            table = pd.read_csv(path, low_memory=False)
        elif suffix in (".parquet", ".pq"):
            table = pd.read_parquet(path)
        else:
            raise UserError(f"{path}: expected a .csv or .parquet file")
    except pd.errors.EmptyDataError:
        raise UserError(f"{path}: empty file") from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError) as error:
        raise UserError(f"{path}: not a readable table: {first_line(error)}") from None
    if table.empty:
        raise UserError(f"{path}: no rows")
    table.columns = [str(column) for column in table.columns]
    return table


def resolve(spec: TableSpec, table: pd.DataFrame, path: str | Path) -> TableSpec:
    """`spec` checked against `table`, with its feature list made explicit."""
    columns = set(table.columns)
    named = [
        *((task.column, f"task {task.name}") for task in spec.tasks),
        *((group.column, "group") for group in spec.groups),
        *((column, "feature") for column in spec.features),
        *((column, "drop") for column in spec.drop),
    ]
    for column, role in named:
        if column not in columns:
            raise UserError(f"{path}: no column '{column}' (named as {role})")
    labels = {task.column for task in spec.tasks}
    groups = {group.column for group in spec.groups}
    features = spec.features or tuple(
        c for c in table.columns if c not in labels | groups | set(spec.drop)
    )
    if not features:
        raise UserError(
            f"{path}: no feature column left (every column is a label, group or dropped)"
        )
    for task in spec.tasks:
        _labels(table[task.column], task, path)
    for group in spec.groups:
        values = _group_values(table[group.column], group, path)
        if values.nunique(dropna=False) < 2:
            raise UserError(
                f"{path}: group column '{group.column}' has one value only: no groups to compare"
            )
    return TableSpec(spec.tasks, spec.groups, tuple(features), (), spec.fractions, spec.data_seed)


def _numbers(cells: pd.Series, path: str | Path, what: str) -> np.ndarray:
    """The cells as float64 (NaN = missing); a one-line error naming the first cell that is
    not a number."""
    values, row = as_numbers(cells)
    if row is not None:
        raise UserError(
            f"{path}: column '{cells.name}' ({what}) must hold numbers; row {row + 1} "
            f"has '{cells.iloc[row]}'"
        )
    return values.to_numpy()


def _labels(cells: pd.Series, task: TaskColumn, path: str | Path) -> tuple[np.ndarray, list]:
    """(mask and value per row (N, 2), the classes) of one task's column."""
    present = cells.notna().to_numpy()
    if not present.any():
        raise UserError(
            f"{path}: task {task.name}: every label in column '{task.column}' is missing"
        )
    if task.kind == "regression":
        values = _numbers(cells, path, f"task {task.name}, regression")
        return np.stack([present, np.nan_to_num(values)], axis=1), []
    classes = sorted(cells[present].unique().tolist(), key=_sort_key)
    if task.kind == "binary" and len(classes) != 2:
        shown = ", ".join(map(_text, classes[:5]))
        raise UserError(
            f"{path}: task {task.name}: a binary column needs exactly two values, "
            f"'{task.column}' has {len(classes)} ({shown}{', ...' if len(classes) > 5 else ''})"
        )
    if len(classes) < 2:
        raise UserError(f"{path}: task {task.name}: column '{task.column}' has one class only")
    index = {value: i for i, value in enumerate(classes)}
    codes = np.array([index.get(value, 0) for value in cells.where(present, classes[0])])
    return np.stack([present, codes], axis=1).astype(np.float64), classes


def _sort_key(value: Any) -> tuple[int, Any]:
    """Numbers before text, each in its own order."""
    return (0, float(value)) if isinstance(value, (int, float, np.number)) else (1, str(value))


def _group_values(cells: pd.Series, group: GroupColumn, path: str | Path) -> pd.Series:
    """Each row's group name: the value as text, or the band of a banded numeric column
    (half-open, `band_names`); missing: "unknown"."""
    if not group.bands:
        return cells.map(_text, na_action="ignore").fillna(UNKNOWN)
    values = _numbers(cells, path, f"group {group.column}, banded")
    names = np.array(band_names(group.bands), dtype=object)
    bands = names[np.searchsorted(np.asarray(group.bands), np.nan_to_num(values), side="right")]
    return pd.Series(np.where(np.isnan(values), UNKNOWN, bands), index=cells.index)


def _text(value: Any) -> str:
    """A cell as a group name: whole numbers without a decimal point (race 1.0 is "1")."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def split_rows(table: pd.DataFrame, spec: TableSpec, path: str | Path) -> dict[str, np.ndarray]:
    """Row indices (sorted) of each split (module docstring: stratified, seeded)."""
    first = spec.tasks[0]
    targets, _ = _labels(table[first.column], first, path)
    if first.kind == "regression":
        edges = np.quantile(targets[targets[:, 0] > 0, 1], np.linspace(0, 1, REGRESSION_STRATA + 1))
        strata = np.searchsorted(edges[1:-1], targets[:, 1], side="right")
    else:
        strata = targets[:, 1].astype(np.int64)
    strata = np.where(targets[:, 0] > 0, strata, -1)
    rng = np.random.default_rng(spec.data_seed)
    chosen: dict[str, list[np.ndarray]] = {split: [] for split in SPLITS}
    _, val_fraction, test_fraction = spec.fractions
    for stratum in np.unique(strata):
        rows = rng.permutation(np.flatnonzero(strata == stratum))
        n_test = round(len(rows) * test_fraction)
        n_val = round(len(rows) * val_fraction)
        chosen["test"].append(rows[:n_test])
        chosen["val"].append(rows[n_test : n_test + n_val])
        chosen["train"].append(rows[n_test + n_val :])
    splits = {split: np.sort(np.concatenate(parts)) for split, parts in chosen.items()}
    for split, rows in splits.items():
        if len(rows) == 0:
            raise UserError(
                f"{path}: the {split} split is empty (fractions {list(spec.fractions)})"
            )
    return splits


@dataclass
class Encoder:
    """The feature encoding, fitted on the training rows (module docstring)."""

    numeric: dict[str, tuple[float, float, float, bool]] = field(default_factory=dict)
    """column -> (median, mean, std, has a missing-indicator column)."""
    categorical: dict[str, list[str]] = field(default_factory=dict)
    """column -> its training levels."""

    @classmethod
    def fit(cls, table: pd.DataFrame, features: Sequence[str]) -> Encoder:
        encoder = cls()
        for column in features:
            cells = table[column]
            if _is_numeric(cells):
                values = cells.to_numpy(dtype=np.float64)
                missing = np.isnan(values)
                median = float(np.median(values[~missing])) if (~missing).any() else 0.0
                filled = np.where(missing, median, values)
                std = float(filled.std())
                encoder.numeric[column] = (
                    median,
                    float(filled.mean()),
                    std or 1.0,
                    bool(missing.any()),
                )
            else:
                encoder.categorical[column] = sorted(set(_levels(cells)))
        return encoder

    @property
    def names(self) -> list[str]:
        """The encoded columns' names, in the order of `transform`."""
        names: list[str] = []
        for column, (*_, indicator) in self.numeric.items():
            names += [column] + ([f"{column}_missing"] if indicator else [])
        for column, levels in self.categorical.items():
            names += [f"{column}={level}" for level in levels]
        return names

    def transform(self, table: pd.DataFrame) -> np.ndarray:
        """The encoded features of `table`'s rows, float32 (N, len(names))."""
        parts: list[np.ndarray] = []
        for column, (median, mean, std, indicator) in self.numeric.items():
            values = table[column].to_numpy(dtype=np.float64)
            missing = np.isnan(values)
            parts.append(((np.where(missing, median, values) - mean) / std)[:, None])
            if indicator:
                parts.append(missing[:, None].astype(np.float64))
        for column, levels in self.categorical.items():
            observed = np.asarray(_levels(table[column]), dtype=object)
            parts.append(observed[:, None] == np.asarray(levels, dtype=object)[None, :])
        return np.concatenate([p.astype(np.float32) for p in parts], axis=1)


def _is_numeric(cells: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(cells) and not pd.api.types.is_bool_dtype(cells)


def _levels(cells: pd.Series) -> list[str]:
    return [MISSING_LEVEL if pd.isna(value) else _text(value) for value in cells]


@dataclass
class TableData:
    """A table read and encoded: per split the encoded features (N, F), each task's targets
    (N, 2) and the rows' indices in the file; the encoder; per regression task the training
    labels' (mean, std); per classification task its classes; the summary."""

    spec: TableSpec
    features: dict[str, np.ndarray]
    targets: dict[str, dict[str, np.ndarray]]
    rows: dict[str, np.ndarray]
    encoder: Encoder
    scales: dict[str, tuple[float, float]]
    classes: dict[str, list[Any]]

    imputed: dict[str, dict[str, int]]
    """feature -> split -> missing cells, for the features with any."""

    def summary(self) -> dict[str, Any]:
        """What the report prints and the experiment records: tasks and kinds, the features
        used and their encoding, groups, split sizes, labelled rows and imputed cells."""
        spec = self.spec
        return {
            "tasks": [f"{task.name}={task.column}:{task.kind}" for task in spec.tasks],
            "features": list(spec.features),
            "categorical_features": list(self.encoder.categorical),
            "encoded_width": len(self.encoder.names),
            "groups": [group_text(group) for group in spec.groups],
            "split_sizes": {split: int(len(rows)) for split, rows in self.rows.items()},
            "labelled": {
                task.name: {
                    split: int(self.targets[split][task.name][:, 0].sum()) for split in SPLITS
                }
                for task in spec.tasks
            },
            "imputed": self.imputed,
            "data_seed": spec.data_seed,
            "fractions": list(spec.fractions),
        }


def group_text(group: GroupColumn) -> str:
    """COLUMN or COLUMN:EDGES, as `parse_group` reads it."""
    return group.column + (":" + ",".join(f"{e:g}" for e in group.bands) if group.bands else "")


def load_table(path: str | Path, spec: TableSpec, table: pd.DataFrame | None = None) -> TableData:
    """Read, check, split and encode the table at `path` as `spec` says (module docstring);
    `table`: the table itself, not yet written to `path`."""
    table = read_table(path) if table is None else table
    spec = resolve(spec, table, path)
    rows = split_rows(table, spec, path)
    train = table.iloc[rows["train"]]
    encoder = Encoder.fit(train, spec.features)
    features, targets, classes, scales = {}, {}, {}, {}
    labels = {task.name: _labels(table[task.column], task, path) for task in spec.tasks}
    for task in spec.tasks:
        classes[task.name] = labels[task.name][1]
        if task.kind == "regression":
            train_labels = labels[task.name][0][rows["train"]]
            known = train_labels[train_labels[:, 0] > 0, 1]
            if known.size == 0:
                raise UserError(f"{path}: task {task.name}: no labelled row in the train split")
            scales[task.name] = (float(known.mean()), float(known.std()) or 1.0)
    for split, indices in rows.items():
        features[split] = encoder.transform(table.iloc[indices])
        targets[split] = {
            name: found[0][indices].astype(np.float32) for name, found in labels.items()
        }
    imputed = {
        column: {split: int(table[column].iloc[rows[split]].isna().sum()) for split in SPLITS}
        for column in spec.features
        if table[column].isna().any()
    }
    return TableData(spec, features, targets, rows, encoder, scales, classes, imputed)


def read_groups(path: str | Path, spec: TableSpec) -> pd.DataFrame:
    """The group audit's attribute table: one row per table row, `stay` its 0-based row index
    as text (the examples' names), then one column per group (`_group_values`)."""
    table = read_table(path)
    columns = {"stay": [str(i) for i in range(len(table))]}
    for group in spec.groups:
        if group.column not in table.columns:
            raise UserError(f"{path}: no column '{group.column}' (named as group)")
        columns[group.column] = _group_values(table[group.column], group, path).to_numpy()
    return pd.DataFrame(columns)
