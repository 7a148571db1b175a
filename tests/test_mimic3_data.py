"""MIMIC-III reader on synthetic benchmark folders: discretisation, labels, splits, errors."""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from relif_ray.cli.make_data import add_parser as add_make_data_parser
from relif_ray.data.mimic3 import (
    CATEGORICAL_VALUES,
    CHANNELS,
    CONTINUOUS_COLUMNS,
    FEATURE_NAMES,
    NORMAL_VALUES,
    discretize,
    num_steps,
    read_episode,
    read_listfile,
    read_mimic3,
)
from relif_ray.data.synthetic_mimic3 import write_synthetic_mimic3
from relif_ray.errors import UserError
from relif_ray.problems import benchmarks
from relif_ray.problems.mimic3 import load_mimic3


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_mimic3(tmp_path_factory.mktemp("m3") / "multitask", patients=10, seed=3)


@pytest.fixture
def copy(folder: Path, tmp_path: Path) -> Path:
    """A private copy of the folder, to corrupt."""
    return Path(shutil.copytree(folder, tmp_path / "multitask"))


def test_feature_layout_is_the_benchmarks_76_columns() -> None:
    assert len(FEATURE_NAMES) == 76
    assert FEATURE_NAMES[:3] == [
        "Capillary refill rate->0.0",
        "Capillary refill rate->1.0",
        "Diastolic blood pressure",
    ]
    assert FEATURE_NAMES[-17:] == [f"mask->{channel}" for channel in CHANNELS]
    assert len(CONTINUOUS_COLUMNS) == 12
    assert all("->" not in FEATURE_NAMES[i] for i in CONTINUOUS_COLUMNS)


def _expected_normal_row() -> np.ndarray:
    row = np.zeros(len(FEATURE_NAMES))
    for channel, normal in NORMAL_VALUES.items():
        if channel in CATEGORICAL_VALUES:
            row[FEATURE_NAMES.index(f"{channel}->{normal}")] = 1.0
        else:
            row[FEATURE_NAMES.index(channel)] = float(normal)
    return row


def test_discretizer_on_a_hand_written_episode(tmp_path: Path) -> None:
    path = tmp_path / "1_episode1_timeseries.csv"
    path.write_text(
        "Hours,Heart Rate,Glascow coma scale total,Capillary refill rate,Temperature\n"
        "-0.5,60,,,\n"  # before admission: ignored
        "0.5,80,,,\n"
        "1.0,,15,,\n"  # t = 1.0 belongs to step 0
        "1.2,90,,,\n"
        "1.7,95,,1.0,\n"  # the later value of step 1 wins
        "3.5,,3,,37.5\n"
        "6.0,120,,,\n"  # after the stay (4 hours): ignored
    )
    features = discretize(read_episode(path), length_of_stay_hours=4.0)

    def column(name: str) -> int:
        return FEATURE_NAMES.index(name)

    expected = np.tile(_expected_normal_row(), (4, 1))
    expected[:, column("Heart Rate")] = [80, 95, 95, 95]
    expected[:, column("mask->Heart Rate")] = [1, 1, 0, 0]
    gcs_15, gcs_3 = column("Glascow coma scale total->15"), column("Glascow coma scale total->3")
    expected[:, gcs_15] = [1, 1, 1, 0]
    expected[:, gcs_3] = [0, 0, 0, 1]
    expected[:, column("mask->Glascow coma scale total")] = [1, 0, 0, 1]
    expected[:, column("Capillary refill rate->0.0")] = [1, 0, 0, 0]
    expected[:, column("Capillary refill rate->1.0")] = [0, 1, 1, 1]
    expected[:, column("mask->Capillary refill rate")] = [0, 1, 0, 0]
    expected[:, column("Temperature")] = [36.6, 36.6, 36.6, 37.5]
    expected[:, column("mask->Temperature")] = [0, 0, 0, 1]
    np.testing.assert_allclose(features, expected)


def test_steps_per_stay_match_the_benchmark() -> None:
    assert [num_steps(x) for x in (0.0, 0.5, 1.0, 4.0, 4.2, 47.999)] == [1, 1, 1, 4, 5, 48]


def test_reader_builds_three_standardised_splits(folder: Path) -> None:
    splits, standardizer = read_mimic3(folder)
    for split, listfile in (
        ("train", folder / "train_listfile.csv"),
        ("val", folder / "val_listfile.csv"),
        ("test", folder / "test" / "listfile.csv"),
    ):
        rows = read_listfile(listfile)
        assert splits[split].names == [row.filename for _, row in rows]
        assert splits[split].lengths.tolist() == [num_steps(row.length_of_stay) for _, row in rows]
        assert splits[split].features.shape[1] == 76
    train = splits["train"].features[:, CONTINUOUS_COLUMNS].double()
    assert torch.allclose(train.mean(0), torch.zeros(12, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(train.std(0), torch.ones(12, dtype=torch.float64), atol=1e-4)
    binary = [i for i in range(76) if i not in CONTINUOUS_COLUMNS]
    assert set(splits["test"].features[:, binary].unique().tolist()) <= {0.0, 1.0}
    assert len(standardizer.means) == 12


def test_per_step_labels_follow_the_benchmarks_batch_generator(copy: Path) -> None:
    episode = copy / "test" / "99_episode1_timeseries.csv"
    episode.write_text("Hours,Heart Rate\n0.3,80\n5.5,90\n")
    decomp = "0;0;0;0;0;1;1;" + "0;0;0;0;0;0;1"  # entries for hours 0..6
    los = "0;0;0;0;0;1;1;" + ";".join(f"{6.5 - t:.6f}" for t in range(7))
    row = ",".join(
        ["99_episode1_timeseries.csv", "6.500000", "0;0;1", los, ";".join("0" * 25), decomp]
    )
    listfile = copy / "test" / "listfile.csv"
    listfile.write_text(listfile.read_text().splitlines()[0] + "\n" + row + "\n")
    test = read_mimic3(copy)[0]["test"]
    batch = test.batch(torch.tensor([0]))
    assert batch["lengths"].tolist() == [7]
    # entry i lands on step max(i - 1, 0): steps 0..5 <- entries 1..6, step 6 unlabelled
    assert batch["decompensation"][0, :, 0].tolist() == [0, 0, 0, 0, 1, 1, 0]
    assert batch["decompensation"][0, :, 1].tolist() == [0, 0, 0, 0, 0, 1, 0]
    assert batch["length_of_stay"][0, :, 1].tolist() == pytest.approx(
        [5.5, 4.5, 3.5, 2.5, 1.5, 0.5, 0]
    )
    assert batch["mortality"][0].tolist() == [0.0, 0.0]  # label zeroed where the mask is 0


def test_batches_pad_with_zeros_and_carry_lengths(folder: Path) -> None:
    split = read_mimic3(folder)[0]["train"]
    lengths = split.lengths
    index = torch.tensor([int(lengths.argmin()), int(lengths.argmax())])
    batch = split.batch(index)
    short = int(lengths.min())
    assert batch["input"].shape == (2, int(lengths.max()), 76)
    assert batch["lengths"].tolist() == lengths[index].tolist()
    assert batch["example_id"].tolist() == index.tolist()
    assert not batch["input"][0, short:].any()
    assert not batch["decompensation"][0, short:].any()
    start = int(split.offsets[index[0]])
    assert torch.equal(batch["input"][0, :short], split.features[start : start + short])


def test_problem_is_registered_with_four_tasks(folder: Path) -> None:
    assert benchmarks()["mimic3"].load is load_mimic3
    problem = load_mimic3(str(folder))
    assert problem.task_names == ["mortality", "decompensation", "phenotype", "length_of_stay"]
    assert set(problem.splits) == {"train", "val", "test"}


def test_writer_is_deterministic_and_refuses_to_overwrite(tmp_path: Path) -> None:
    first = write_synthetic_mimic3(tmp_path / "a", patients=4, seed=1)
    second = write_synthetic_mimic3(tmp_path / "b", patients=4, seed=1)
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file())
    assert all((first / f).read_bytes() == (second / f).read_bytes() for f in files)
    with pytest.raises(UserError, match="exists and is not empty"):
        write_synthetic_mimic3(first, patients=4, seed=1)
    with pytest.raises(UserError, match="--patients"):
        write_synthetic_mimic3(tmp_path / "c", patients=2, seed=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no temporary left


def test_force_replaces_a_data_set_but_never_unrelated_files(tmp_path: Path) -> None:
    out = write_synthetic_mimic3(tmp_path / "m", patients=3, seed=1)
    before = (out / "train_listfile.csv").read_text()
    write_synthetic_mimic3(out, patients=4, seed=2, overwrite=True)
    assert (out / "train_listfile.csv").read_text() != before
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="refusing to replace"):
        write_synthetic_mimic3(out, patients=4, seed=2, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"


def test_make_data_writes_mimic3_with_patients_and_seed(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_make_data_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "made"
    args = parser.parse_args(["make-data", "mimic3", "--out", str(out), "--patients", "5"])
    assert args.handler(args) == 0
    splits, _ = read_mimic3(out)
    assert sum(len(split) for split in splits.values()) >= 5  # one or two stays per patient


def _replace_line(path: Path, line: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")


def _first_episode(copy: Path) -> Path:
    return copy / "train" / read_listfile(copy / "train_listfile.csv")[0][1].filename


def _fields(copy: Path) -> list[str]:
    return (copy / "train_listfile.csv").read_text().splitlines()[1].split(",")


def _break_row(copy: Path, field: int, value: str) -> None:
    fields = _fields(copy)
    fields[field] = value
    _replace_line(copy / "train_listfile.csv", 2, ",".join(fields))


BROKEN = {
    "missing split listfile": (
        lambda c: (c / "train_listfile.csv").unlink(),
        "train_listfile.csv: not found",
    ),
    "missing test listfile": (
        lambda c: (c / "test" / "listfile.csv").unlink(),
        r"test/listfile.csv: listfile not found",
    ),
    "missing episode": (
        lambda c: _first_episode(c).unlink(),
        r"train_listfile.csv: line 2: episode file .* not found",
    ),
    "wrong header": (
        lambda c: _replace_line(c / "val_listfile.csv", 1, "file,los"),
        r"val_listfile.csv: line 1: expected the multitask header",
    ),
    "too few fields": (
        lambda c: _replace_line(c / "train_listfile.csv", 2, ",".join(_fields(c)[:5])),
        r"train_listfile.csv: line 2: expected 6 comma-separated fields, got 5",
    ),
    "wrong phenotype count": (
        lambda c: _break_row(c, 4, ";".join("0" * 24)),
        r"train_listfile.csv: line 2: expected 25 phenotype labels, got 24",
    ),
    "non-numeric length of stay": (
        lambda c: _break_row(c, 1, "long"),
        r"train_listfile.csv: line 2: length of stay must be a number, got 'long'",
    ),
    "bad mortality triple": (
        lambda c: _break_row(c, 2, "47;1"),
        r"train_listfile.csv: line 2: in-hospital mortality needs pos;mask;label",
    ),
    "odd mask/label count": (
        lambda c: _break_row(c, 5, "0;0;1"),
        r"train_listfile.csv: line 2: decompensation needs as many labels as masks",
    ),
    "non-binary decompensation label": (
        lambda c: _break_row(c, 5, "1;2"),
        r"train_listfile.csv: line 2: decompensation labels must be 0 or 1",
    ),
    "non-numeric remaining stay": (
        lambda c: _break_row(c, 3, "1;x"),
        r"train_listfile.csv: line 2: length of stay label must be a number, got 'x'",
    ),
    "too many label entries": (
        lambda c: _break_row(c, 5, ";".join(["0"] * 2000)),
        r"train_listfile.csv: line 2: 1000 decompensation entries do not fit",
    ),
    "non-numeric value": (
        lambda c: _replace_line(_first_episode(c), 2, "0.5,,abc" + "," * 15),
        r"_timeseries.csv: line 2: Diastolic blood pressure must be a number, got 'abc'",
    ),
    "unknown categorical value": (
        lambda c: _replace_line(_first_episode(c), 2, "0.5,,,,Wide awake" + "," * 13),
        r"_timeseries.csv: line 2: unknown value 'Wide awake' for 'Glascow coma scale eye opening'",
    ),
    "empty episode": (
        lambda c: _first_episode(c).write_text("Hours," + ",".join(CHANNELS) + "\n"),
        r"_timeseries.csv: line 2: empty episode",
    ),
    "unknown variable": (
        lambda c: _replace_line(_first_episode(c), 1, "Hours,Pulse" + ",x" * 16),
        r"_timeseries.csv: line 1: unknown variable column 'Pulse'",
    ),
    "ragged episode row": (
        lambda c: _replace_line(_first_episode(c), 3, "1.5,0.0"),
        r"_timeseries.csv: line 3: expected 18 fields, got 2",
    ),
    "non-numeric time": (
        lambda c: _replace_line(_first_episode(c), 2, "noon" + "," * 17),
        r"_timeseries.csv: line 2: Hours must be a number, got 'noon'",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_bad_input_is_one_line_naming_file_and_line(copy: Path, case: str) -> None:
    corrupt, pattern = BROKEN[case]
    corrupt(copy)
    with pytest.raises(UserError) as raised:
        read_mimic3(copy)
    message = str(raised.value)
    assert "\n" not in message
    assert str(copy) in message
    assert re.search(pattern, message), message


def test_ordinary_gaps_are_handled(copy: Path) -> None:
    """A charting time without values and a blank line change nothing."""
    before = read_mimic3(copy)[0]["train"].features
    episode = _first_episode(copy)
    text = episode.read_text().splitlines()
    blank_row = "2.25" + "," * 17
    episode.write_text("\n".join([text[0], blank_row, *text[1:]]) + "\n\n")
    assert torch.equal(read_mimic3(copy)[0]["train"].features, before)
