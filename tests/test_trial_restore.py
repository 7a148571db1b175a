"""Restoring a trial's engine state when Tune names a checkpoint that is gone
(`relif_ray.tuning.trainable.newest_complete_state`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relif_ray.errors import UserError
from relif_ray.tuning.trainable import STATE_FILE, newest_complete_state


def checkpoint(trial: Path, index: int, epoch: int | None) -> Path:
    """checkpoint_00000{index} of `trial`, holding a state of `epoch` (None: an empty folder, as
    Tune's deletion of an older checkpoint can leave it)."""
    folder = trial / f"checkpoint_{index:06d}"
    folder.mkdir(parents=True)
    if epoch is not None:
        torch.save({"epoch": epoch, "weights": torch.arange(4.0) * epoch}, folder / STATE_FILE)
    return folder


def test_the_named_checkpoint_is_loaded_where_it_has_a_state(tmp_path):
    named = checkpoint(tmp_path, 0, epoch=1)
    checkpoint(tmp_path, 1, epoch=2)
    assert newest_complete_state(named)["epoch"] == 1


def test_a_deleted_checkpoint_falls_back_to_the_newest_complete_one_beside_it(tmp_path):
    """The experiment state of a killed driver names checkpoint 0, which Tune's num_to_keep=1
    deleted when it registered checkpoint 1; checkpoint 2 was cut off mid-write."""
    named = checkpoint(tmp_path, 0, epoch=None)
    checkpoint(tmp_path, 1, epoch=2)
    torch.save({"epoch": 3, "weights": torch.zeros(1000)}, tmp_path / "whole.pt")
    half = checkpoint(tmp_path, 2, epoch=None) / STATE_FILE
    half.write_bytes((tmp_path / "whole.pt").read_bytes()[:600])
    state = newest_complete_state(named)
    assert state["epoch"] == 2 and torch.equal(state["weights"], torch.arange(4.0) * 2)


def test_a_trial_without_any_state_is_a_one_line_error(tmp_path):
    named = checkpoint(tmp_path, 0, epoch=None)
    with pytest.raises(UserError, match="checkpoint_000000/state.pt is missing"):
        newest_complete_state(named)
