"""Restoring a trial's engine state when Tune names a checkpoint that is gone
(`relif_ray.tuning.trainable.surviving_checkpoint` and `newest_complete_state`)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pyarrow.fs
import pytest
import torch
from ray import tune
from ray.train._internal.session import _TrainingResult

from relif_ray.errors import UserError
from relif_ray.experiment import storage
from relif_ray.tuning.trainable import (
    STATE_FILE,
    newest_complete_state,
    readable_state,
    surviving_checkpoint,
    write_state,
)
from tests.conftest import BUCKET


def checkpoint(trial: Path, index: int, epoch: int | None) -> Path:
    """checkpoint_00000{index} of `trial`, holding a state of `epoch` (None: an empty folder, as
    Tune's deletion of an older checkpoint can leave it)."""
    folder = trial / f"checkpoint_{index:06d}"
    folder.mkdir(parents=True)
    if epoch is not None:
        write_state({"epoch": epoch, "weights": torch.arange(4.0) * epoch}, folder / STATE_FILE)
    return folder


def test_a_state_written_without_checksums_loads_back_and_a_cut_one_does_not(tmp_path):
    """`write_state` leaves out the zip records' CRC-32 (torch.load never reads it) and puts
    the process-wide setting back; what it wrote loads back equal, and the file cut off at any
    of several points does not load at all."""
    state = {"epoch": 3, "weights": torch.randn(64, 64), "steps": [1, 2]}
    path = tmp_path / STATE_FILE
    write_state(state, path)
    assert torch.serialization.get_crc32_options() is True
    assert {record.CRC for record in zipfile.ZipFile(path).infolist()} == {0}
    loaded = readable_state(path)
    assert loaded["epoch"] == 3 and loaded["steps"] == [1, 2]
    assert torch.equal(loaded["weights"], state["weights"])
    whole = path.read_bytes()
    for cut in (100, len(whole) // 2, len(whole) - 30):
        path.write_bytes(whole[:cut])
        assert readable_state(path) is None, cut


def test_the_named_checkpoint_is_loaded_where_it_has_a_state(tmp_path):
    named = checkpoint(tmp_path, 0, epoch=1)
    checkpoint(tmp_path, 1, epoch=2)
    assert newest_complete_state(named)["epoch"] == 1


def test_a_deleted_checkpoint_falls_back_to_the_newest_complete_one_beside_it(tmp_path):
    """The experiment state of a killed driver names checkpoint 0, which Tune's num_to_keep=1
    deleted when it registered checkpoint 1; checkpoint 2 was cut off mid-write."""
    named = checkpoint(tmp_path, 0, epoch=None)
    checkpoint(tmp_path, 1, epoch=2)
    write_state({"epoch": 3, "weights": torch.zeros(1000)}, tmp_path / "whole.pt")
    half = checkpoint(tmp_path, 2, epoch=None) / STATE_FILE
    half.write_bytes((tmp_path / "whole.pt").read_bytes()[:600])
    state = newest_complete_state(named)
    assert state["epoch"] == 2 and torch.equal(state["weights"], torch.arange(4.0) * 2)


def test_a_trial_without_any_state_is_a_one_line_error(tmp_path):
    named = checkpoint(tmp_path, 0, epoch=None)
    with pytest.raises(UserError, match="checkpoint_000000/state.pt is missing"):
        newest_complete_state(named)


def test_a_truncated_named_state_falls_back_to_a_complete_one_beside_it(tmp_path):
    checkpoint(tmp_path, 0, epoch=1)
    named = checkpoint(tmp_path, 1, epoch=None)
    for cut in (b"PK\x03\x04 cut off", b"\x80\x02 not a zip"):  # torch's two file formats
        (named / STATE_FILE).write_bytes(cut)
        assert newest_complete_state(named)["epoch"] == 1


def restore_result(path: str, filesystem: pyarrow.fs.FileSystem) -> _TrainingResult:
    """What Tune hands `Trainable.restore` on resume: the checkpoint its experiment state names."""
    return _TrainingResult(tune.Checkpoint(path, filesystem=filesystem), {"training_iteration": 1})


def test_a_checkpoint_deleted_whole_is_replaced_by_the_newest_with_a_state(tmp_path):
    """Tune's num_to_keep=1 removed checkpoint 1 whole before the killed driver's experiment
    state said so; checkpoints 2 and 10 hold states, 11 none yet. The named folder is made
    again, empty, for Tune's driver to delete when the trial's next checkpoint replaces it."""
    local = pyarrow.fs.LocalFileSystem()
    for index, epoch in ((2, 2), (10, 10), (11, None)):
        checkpoint(tmp_path, index, epoch)
    (tmp_path / "result.json").write_text("{}")
    named = tmp_path / "checkpoint_000001"
    result = surviving_checkpoint(restore_result(str(named), local))
    assert result.checkpoint.path == str(tmp_path / "checkpoint_000010")
    assert result.metrics == {"training_iteration": 1}
    assert named.is_dir() and not list(named.iterdir())


def test_a_part_deleted_checkpoint_is_replaced_too(tmp_path):
    named = checkpoint(tmp_path, 0, epoch=None)  # Tune's deletion cut off: the folder is left
    checkpoint(tmp_path, 1, epoch=1)
    result = surviving_checkpoint(restore_result(str(named), pyarrow.fs.LocalFileSystem()))
    assert result.checkpoint.path == str(tmp_path / "checkpoint_000001")


def test_a_checkpoint_with_a_state_or_nothing_beside_it_is_left_as_named(tmp_path):
    local = pyarrow.fs.LocalFileSystem()
    named = checkpoint(tmp_path / "kept", 0, epoch=0)
    checkpoint(tmp_path / "kept", 1, epoch=1)
    assert surviving_checkpoint(restore_result(str(named), local)).checkpoint.path == str(named)
    for trial in ("alone", "empty-beside", "gone"):
        if trial != "gone":
            (tmp_path / trial).mkdir()
        if trial == "empty-beside":
            checkpoint(tmp_path / trial, 4, epoch=None)
        path = str(tmp_path / trial / "checkpoint_000003")
        assert surviving_checkpoint(restore_result(path, local)).checkpoint.path == path
        assert not Path(path).exists()  # Tune's own error stands; nothing is made


def test_a_deleted_checkpoint_on_object_storage_is_replaced_too(s3, tmp_path):
    """The trial folder lives in a bucket (moto S3 on 127.0.0.1): listed by its own pyarrow
    file system, as Tune stores it."""
    filesystem, root = storage.filesystem(storage.location(f"s3://{BUCKET}/restore"))
    for index in (4, 5):
        folder = checkpoint(tmp_path, index, epoch=index)
        with filesystem.open_output_stream(f"{root}/trial/{folder.name}/{STATE_FILE}") as out:
            out.write((folder / STATE_FILE).read_bytes())
    result = surviving_checkpoint(restore_result(f"{root}/trial/checkpoint_000003", filesystem))
    assert result.checkpoint.path == f"{root}/trial/checkpoint_000005"
    assert result.checkpoint.filesystem is filesystem
