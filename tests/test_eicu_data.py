"""eICU reader (Sheikhalishahi et al. benchmark layout) on synthetic and hand-written files."""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from relif_ray.cli.make_data import add_parser as add_make_data_parser
from relif_ray.config import ModelConfig
from relif_ray.data.eicu import (
    FEATURE_COLUMNS,
    FEATURE_NAMES,
    REQUIRED_COLUMNS,
    TIME_VARYING_NORMALS,
    read_all_data,
    read_eicu,
    read_splits,
    stay_arrays,
)
from relif_ray.data.synthetic_eicu import HEADER, write_synthetic_eicu
from relif_ray.errors import UserError
from relif_ray.problems import benchmarks
from relif_ray.problems.eicu import load_eicu


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_eicu(tmp_path_factory.mktemp("eicu") / "root", patients=12, seed=2)


@pytest.fixture
def copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / "root"))


def _csv(path: Path, rows: list[dict[str, str]]) -> Path:
    """Write an all_data.csv with the benchmark's columns; unspecified cells get a default."""
    defaults = {column: "1" for column in HEADER}
    defaults.update({"age": "70", "gender": "2", "hospitaldischargestatus": "0"})
    lines = [",".join(HEADER)]
    lines += [",".join({**defaults, **row}[column] for column in HEADER) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _rows_of(table, stay: int) -> dict[str, np.ndarray]:
    chosen = table["patientunitstayid"].to_numpy() == stay
    return {name: table[name].to_numpy()[chosen] for name in REQUIRED_COLUMNS}


def test_hand_written_stay(tmp_path: Path) -> None:
    stay = {"patientunitstayid": "7", "unitdischargeoffset": "300"}  # 5 hours
    path = _csv(
        tmp_path / "all_data.csv",
        [
            {**stay, "itemoffset": "-1", "Heart Rate": "50"},  # before admission: ignored
            {**stay, "itemoffset": "1", "Heart Rate": "80", "admissionheight": ""},
            {**stay, "itemoffset": "3", "Heart Rate": "90", "pH": ""},
            {**stay, "itemoffset": "3", "Heart Rate": "95"},  # last row of the hour wins
            {**stay, "itemoffset": "6", "Heart Rate": "99"},  # after discharge: ignored
        ],
    )
    features, mortality, length_of_stay = stay_arrays(_rows_of(read_all_data(path), 7))
    assert features.shape == (4, len(FEATURE_NAMES))  # hours 1..4 (discharge at 5 h)
    column = FEATURE_COLUMNS.index
    assert features[:, column("Heart Rate")].tolist() == [80, 80, 95, 95]
    assert features[:, column("pH")].tolist() == [1, 1, 1, 1]  # the empty cell is not a value
    assert features[:, column("admissionheight")].tolist() == [1, 1, 1, 1]  # first given value
    assert features[:, -1].tolist() == [1, 0, 1, 0]
    assert length_of_stay.tolist() == [[1, 4], [0, 0], [1, 2], [0, 0]]
    assert mortality.tolist() == [0, 0]  # not longer than 48 hours


def test_normal_values_fill_before_the_first_value_and_mortality_reads_hour_48(
    tmp_path: Path,
) -> None:
    stay = {"patientunitstayid": "8", "unitdischargeoffset": "3000", "hospitaldischargestatus": "1"}
    path = _csv(
        tmp_path / "all_data.csv",
        [
            {**stay, "itemoffset": "2", "glucose": "", "admissionweight": ""},
            {**stay, "itemoffset": "10", "glucose": "200", "admissionweight": ""},
        ],
    )
    features, mortality, length_of_stay = stay_arrays(_rows_of(read_all_data(path), 8))
    assert features.shape[0] == 48  # charted until hour 10, extended to hour 48
    glucose = features[:, FEATURE_COLUMNS.index("glucose")]
    assert glucose[:9].tolist() == [TIME_VARYING_NORMALS["glucose"]] * 9
    assert glucose[9:].tolist() == [200.0] * 39
    assert features[:, FEATURE_COLUMNS.index("admissionweight")].tolist() == [81.0] * 48
    assert mortality.tolist() == [1, 1]
    assert np.flatnonzero(length_of_stay[:, 0]).tolist() == [1, 9]
    assert length_of_stay[[1, 9], 1].tolist() == [48.0, 40.0]


def test_stays_without_charted_hours_are_left_out(tmp_path: Path) -> None:
    table = read_all_data(
        _csv(
            tmp_path / "all_data.csv",
            [{"patientunitstayid": "9", "unitdischargeoffset": "50", "itemoffset": "1"}],
        )
    )
    assert stay_arrays(_rows_of(table, 9)) is None


def test_reader_builds_the_splits_of_splits_csv(folder: Path) -> None:
    splits, _ = read_eicu(folder)
    listed = dict(line.split(",") for line in (folder / "splits.csv").read_text().splitlines()[1:])
    for name, split in splits.items():
        assert all(listed[stay] == name for stay in split.names)
        assert split.features.shape[1] == len(FEATURE_NAMES) == 19
    assert sum(len(s) for s in splits.values()) == len(listed)
    train = splits["train"].features[:, : len(FEATURE_COLUMNS)].double()
    varying = train.std(0) > 0
    assert torch.allclose(train.mean(0), torch.zeros_like(train[0]), atol=1e-4)
    assert torch.allclose(train.std(0)[varying], torch.ones_like(train[0])[varying], atol=1e-4)
    batch = splits["val"].batch(torch.arange(len(splits["val"])))
    assert set(batch) == {"input", "lengths", "example_id", "mortality", "length_of_stay"}


def test_default_split_is_seeded_and_covers_every_stay(tmp_path: Path) -> None:
    ids = np.repeat(np.arange(100, 140), 3)
    split_of = read_splits(tmp_path, ids, tmp_path / "all_data.csv")
    assert split_of == read_splits(tmp_path, ids[::-1], tmp_path / "all_data.csv")
    counts = {name: list(split_of.values()).count(name) for name in ("train", "val", "test")}
    assert counts == {"train": 28, "val": 6, "test": 6}


def test_problem_is_registered_with_two_tasks(folder: Path) -> None:
    assert benchmarks()["eicu"].load is load_eicu
    problem = load_eicu(str(folder))
    assert problem.task_names == ["mortality", "length_of_stay"]
    model = problem.build_model(ModelConfig(hidden_size=4))
    output = model(problem.splits["test"].batch(torch.tensor([0])))
    assert set(output.predictions) == {"mortality", "length_of_stay"}


def test_writer_is_deterministic_and_refuses_to_overwrite(tmp_path: Path) -> None:
    first = write_synthetic_eicu(tmp_path / "a", patients=5, seed=4)
    second = write_synthetic_eicu(tmp_path / "b", patients=5, seed=4)
    for name in ("all_data.csv", "splits.csv"):
        assert (first / name).read_bytes() == (second / name).read_bytes()
    with pytest.raises(UserError, match="exists and is not empty"):
        write_synthetic_eicu(first, patients=5, seed=4)
    with pytest.raises(UserError, match="--patients"):
        write_synthetic_eicu(tmp_path / "c", patients=1, seed=4)


def test_make_data_writes_eicu_and_force_replaces_it(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_make_data_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "made"
    for extra in ([], ["--force"]):
        argv = ["make-data", "eicu", "--out", str(out), "--patients", "6", "--seed", "3", *extra]
        args = parser.parse_args(argv)
        assert args.handler(args) == 0
    assert sum(len(split) for split in read_eicu(out)[0].values()) == 6
    with pytest.raises(UserError, match="use --force"):
        args = parser.parse_args(["make-data", "eicu", "--out", str(out), "--patients", "6"])
        args.handler(args)


def _edit_cell(root: Path, line: int, column: str, value: str) -> None:
    path = root / "all_data.csv"
    lines = path.read_text().splitlines()
    index = lines[0].split(",").index(column)
    fields = lines[line - 1].split(",")
    fields[index] = value
    lines[line - 1] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")


def _drop_column(root: Path, column: str) -> None:
    path = root / "all_data.csv"
    rows = [line.split(",") for line in path.read_text().splitlines()]
    index = rows[0].index(column)
    path.write_text("\n".join(",".join(r[:index] + r[index + 1 :]) for r in rows) + "\n")


BROKEN = {
    "missing all_data.csv": (
        lambda r: (r / "all_data.csv").unlink(),
        r"all_data.csv: not found",
    ),
    "missing column": (
        lambda r: _drop_column(r, "Heart Rate"),
        r"all_data.csv: line 1: missing column 'Heart Rate'",
    ),
    "no rows": (
        lambda r: (r / "all_data.csv").write_text(",".join(HEADER) + "\n"),
        r"all_data.csv: line 2: no rows after the header",
    ),
    "non-numeric value": (
        lambda r: _edit_cell(r, 4, "Heart Rate", "fast"),
        r"all_data.csv: line 4: column 'Heart Rate' must be a number, got 'fast'",
    ),
    "missing age": (
        lambda r: _edit_cell(r, 3, "age", ""),
        r"all_data.csv: line 3: missing value in column 'age'",
    ),
    "fractional hour": (
        lambda r: _edit_cell(r, 5, "itemoffset", "2.5"),
        r"all_data.csv: line 5: 'itemoffset' must be a whole number",
    ),
    "unknown discharge status": (
        lambda r: _edit_cell(r, 2, "hospitaldischargestatus", "3"),
        r"all_data.csv: line 2: hospitaldischargestatus must be 0, 1 or 2",
    ),
    "bad split name": (
        lambda r: (r / "splits.csv").write_text("patientunitstayid,split\n141000,dev\n"),
        r"splits.csv: line 2: expected '<stay id>,train\|val\|test', got '141000,dev'",
    ),
    "stay without split": (
        lambda r: (r / "splits.csv").write_text("patientunitstayid,split\n141000,train\n"),
        r"splits.csv: no split for stay 141001 \(.*all_data.csv line \d+\)",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_bad_input_is_one_line_naming_file_and_line(copy: Path, case: str) -> None:
    corrupt, pattern = BROKEN[case]
    corrupt(copy)
    with pytest.raises(UserError) as raised:
        read_eicu(copy)
    message = str(raised.value)
    assert "\n" not in message and str(copy) in message
    assert re.search(pattern, message), message
