"""`--resume` after a driver killed while Ray Tune wrote its state: the cut-off file is put
back from the killed driver's staging copy, or the resume stops with one line; a restore that
Tune gives up on never starts the sweep over (`relif_ray.tuning.resume`, `ReferenceOrder`)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import ray.cloudpickle as cloudpickle

from relif_ray.errors import UserError
from relif_ray.experiment.layout import newest_driver_state
from relif_ray.tuning.order import SNAPSHOT_FORMAT, ReferenceOrder
from relif_ray.tuning.resume import drop_held_decisions, is_complete, repair_driver_state

RUN = "2026-11-26_10-00-00"
STATE = {
    "trial_data": [['{"trial_id": "a", "config": {"seed": 0}}', "{}"]],
    "runner_data": {"x": [1.5, None]},
}


def documents() -> dict[str, bytes]:
    """The three kinds of driver state: Tune's JSON trial list and pickled search generator,
    and our trial order's JSON snapshot (in the file Tune names `searcher-state-*.pkl`)."""
    order = ReferenceOrder([{"config": {"label": "erm", "seed": 0}}], "/nowhere")
    snapshot = {"format": SNAPSHOT_FORMAT, "items": [{"seed": 0}], "ready": {}, "failed": {}}
    return {
        f"experiment_state-{RUN}.json": json.dumps(STATE).encode(),
        f"search_gen_state-{RUN}.json": cloudpickle.dumps({"counter": 2, "order": order}),
        f"searcher-state-{RUN}.pkl": json.dumps({**snapshot, "studies": None}).encode(),
    }


@pytest.mark.parametrize("name", list(documents()))
def test_a_whole_file_is_complete_and_every_cut_of_it_is_not(name):
    data = documents()[name]
    assert is_complete(data)
    assert not any(is_complete(data[:cut]) for cut in range(len(data)))


def experiment_with(tmp_path: Path, cut: str | None) -> Path:
    """An experiment folder holding the driver state of an older and a newer run, the newer
    file `cut` (if any) cut in half, beside a trial folder."""
    experiment = tmp_path / "storage" / "sweep"
    (experiment / "erm_seed0_a").mkdir(parents=True)
    (experiment / "erm_seed0_a" / "result.json").write_text("{")  # a trial's file: not checked
    (experiment / "experiment_state-2026-11-25_09-00-00.json").write_text("{")
    for name, data in documents().items():
        (experiment / name).write_bytes(data[: len(data) // 2] if name == cut else data)
    return experiment


def staging_copy(temp_root: Path, name: str, data: bytes, session: str = "session_1") -> Path:
    path = temp_root / session / "artifacts" / "2026-11-26_10-00-00" / "sweep" / "driver_artifacts"
    path.mkdir(parents=True, exist_ok=True)
    (path / name).write_bytes(data)
    return path / name


def test_a_resume_reads_the_newest_state_of_each_kind(tmp_path):
    assert newest_driver_state(str(experiment_with(tmp_path, None))) == list(documents())
    assert newest_driver_state(str(tmp_path / "missing")) == []


@pytest.mark.parametrize("name", list(documents()))
def test_a_cut_off_file_is_put_back_from_the_killed_drivers_staging_copy(tmp_path, name):
    experiment, whole = experiment_with(tmp_path, name), documents()[name]
    temp_root = tmp_path / "ray"
    staging_copy(temp_root, name, whole[:-1], session="session_2")  # newer, itself cut off
    staging_copy(temp_root, name, whole)
    assert repair_driver_state(str(experiment), temp_root) == [name]
    assert (experiment / name).read_bytes() == whole
    assert not list(experiment.glob(".*partial"))
    assert repair_driver_state(str(experiment), temp_root) == []  # nothing left to put back


def test_a_cut_off_file_without_a_complete_copy_stops_the_resume(tmp_path):
    name = f"experiment_state-{RUN}.json"
    experiment, temp_root = experiment_with(tmp_path, name), tmp_path / "ray"
    staging_copy(temp_root, name, documents()[name][:10])
    with pytest.raises(UserError, match=f"--resume: .*/sweep/{name} is incomplete .* new --name"):
        repair_driver_state(str(experiment), temp_root)


def test_the_order_hands_out_nothing_in_a_resume_that_did_not_restore_it(tmp_path):
    order = ReferenceOrder([{"config": {"label": "erm", "seed": 0}}], str(tmp_path))
    resumed = pickle.loads(pickle.dumps(order))  # as a resume unpickles it from tuner.pkl
    with pytest.raises(UserError, match="--resume: Ray Tune could not restore the sweep"):
        resumed.suggest("t1")
    order.set_search_properties("worst", "max", {"delta": 0.2})  # a new run starts
    assert order.suggest("t1") == {"label": "erm", "seed": 0}


class Payload:
    """What a planted pickle would run when it is loaded: write a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "unpickled"))


def test_a_planted_pickle_is_never_loaded_as_the_trial_orders_snapshot(tmp_path):
    """Our own driver state is JSON: a pickle put in its place (by anyone who can write the
    storage) is refused in one line, and nothing in it runs."""
    marker = tmp_path / "ran"
    planted = tmp_path / f"searcher-state-{RUN}.pkl"
    planted.write_bytes(
        pickle.dumps({"items": [], "ready": {}, "failed": {}, "x": Payload(marker)})
    )
    order = ReferenceOrder([], str(tmp_path))
    reason = "not a JSON snapshot; a pickle is never loaded"
    with pytest.raises(UserError, match=f"{planted}: damaged file .{reason}"):
        order.restore(str(planted))
    assert not marker.exists()
    with pytest.raises(UserError, match="--resume: Ray Tune could not restore"):
        order.suggest("t1")  # and a resume that went on regardless hands out nothing


def test_a_planted_pickle_stops_the_resume_before_ray(tmp_path, nyuv2_dir, capsys, no_sweep):
    from relif_ray.cli.sweep import main

    marker, experiment = tmp_path / "ran", tmp_path / "results" / "sweep"
    experiment.mkdir(parents=True)
    (experiment / f"experiment_state-{RUN}.json").write_text(json.dumps(STATE))
    planted = experiment / f"searcher-state-{RUN}.pkl"
    planted.write_bytes(pickle.dumps(Payload(marker)))
    argv = ["--data-dir", str(nyuv2_dir), "--resume", "--name", "sweep"]
    assert main([*argv, "--storage", str(tmp_path / "results")], datasets=("nyuv2",)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        f"--resume: {planted} is not the JSON snapshot of a sweep's trial order (a pickle is "
        "never loaded); the sweep cannot be resumed"
    ), err
    assert not marker.exists()


def test_a_resume_drops_the_decisions_tune_held_for_saves_of_the_killed_run(tmp_path):
    """A trial whose last failure came during a save (a full disk) leaves Tune's held STOP in
    the trial list; resumed, it would end the trial at its first checkpoint
    (`drop_held_decisions`; tests/test_survival.py meets it on a real sweep)."""
    experiment = experiment_with(tmp_path, None)
    name = f"experiment_state-{RUN}.json"
    held = {"_cached_trial_decisions": {"a": "STOP"}, "_queued_trial_decisions": {"b": "PAUSE"}}
    (experiment / name).write_text(json.dumps({**STATE, "runner_data": {"x": 1, **held}}))
    assert repair_driver_state(str(experiment), tmp_path / "ray") == []
    state = json.loads((experiment / name).read_text())
    assert state == {**STATE, "runner_data": {"x": 1, **dict.fromkeys(held, {})}}
    assert drop_held_decisions(str(experiment)) == {}  # nothing left to drop
