"""A storage location read once (`relif_ray.experiment.storage.parse`): its filesystem, its
path there, the text the library passes on and the form a user is shown, kept through joins;
a sweep's request reads `--storage` once, and its checks and lock enter storage for I/O
only."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from relif_ray.errors import UserError
from relif_ray.experiment import storage
from relif_ray.experiment.lock import exclusive_experiment, prepare_new_experiment
from relif_ray.experiment.storage import StorageLocation, parse
from relif_ray.sweep import preflight
from relif_ray.sweep.preflight import check_storage, sweep_exists
from relif_ray.sweep.request import SweepRequest


def test_a_local_location_is_read_once_into_its_filesystem_path_and_forms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    place = parse("results", "--storage")
    assert place.local == tmp_path / "results" and place.text == str(tmp_path / "results")
    assert isinstance(place.filesystem, pafs.LocalFileSystem)
    assert parse(f"file://{tmp_path}/results") == place  # a file:// URI is the same place
    trial = place.join("exp", "trial_1")
    assert trial.local == tmp_path / "results" / "exp" / "trial_1"
    assert storage.filesystem(trial) == (place.filesystem, str(tmp_path / "results/exp/trial_1"))
    assert storage.parent(trial) == place.join("exp")
    assert storage.display(trial) == str(trial.local) and parse(trial) is trial
    place.local.mkdir()
    storage.write_text(place.join("note.txt"), "x")
    assert storage.read_text(place.join("note.txt")) == "x"


def test_a_bucket_location_keeps_its_options_and_shows_no_credentials(monkeypatch):
    class Stores:  # a bucket's filesystem, without a store to answer
        def __call__(self, uri: str) -> tuple[str, str]:
            return ("store of", uri)

        def cache_clear(self) -> None:
            pass

    monkeypatch.setattr(storage, "_bucket_filesystem", Stores())
    for name in (*storage.CREDENTIAL_VARIABLES, "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "before")  # put back after the test
    place = parse("s3://KEY:SECRET@bucket/runs?endpoint_override=127.0.0.1:9000", "--storage")
    assert place.local is None and "SECRET" not in place.text
    assert place.text == "s3://bucket/runs?endpoint_override=127.0.0.1:9000"
    assert place.filesystem == ("store of", "s3://bucket?endpoint_override=127.0.0.1:9000")
    joined = place.join("exp")
    assert joined.text == "s3://bucket/runs/exp?endpoint_override=127.0.0.1:9000"
    assert (joined.path, joined.display) == ("bucket/runs/exp", "s3://bucket/runs/exp")
    assert storage.parent(joined).path == "bucket/runs"
    with pytest.raises(UserError, match=r"^--storage ftp://host/x: unsupported storage"):
        parse("ftp://host/x", "--storage")


def test_a_sweeps_request_reads_its_storage_once_and_its_checks_do_io_only(tmp_path, monkeypatch):
    request = SweepRequest(name="exp", storage=str(tmp_path / "results"))
    assert isinstance(request.storage, StorageLocation)
    read_again = []
    location = storage.location

    def only_read(text, what=""):  # noqa: ANN001, ANN202
        if not isinstance(text, StorageLocation):
            read_again.append(text)
        return location(text, what)

    monkeypatch.setattr(storage, "location", only_read)
    monkeypatch.setattr(preflight, "location", only_read)
    check_storage(request.storage)
    assert not sweep_exists(request.storage, request.name)
    with exclusive_experiment(request.storage, request.name):
        prepare_new_experiment(request.storage, request.name, replace=False)
        assert (Path(request.storage.text) / "exp").is_dir()
    assert read_again == []


def test_a_resume_check_lists_the_experiment_once_and_reads_each_file_once(tmp_path, monkeypatch):
    """`--resume`'s check (`check_resumable`): one listing of the experiment says whether a
    sweep is there and which driver state to read, and each file is read once."""
    from relif_ray.experiment import layout

    experiment = tmp_path / "results" / "exp"
    experiment.mkdir(parents=True)
    trial = json.dumps({"trial_id": "a_00000", "config": {}, "status": "TERMINATED"})
    trial_list = experiment / "experiment_state-2026-01-01_00-00-00.json"
    trial_list.write_text(json.dumps({"trial_data": [[trial, "{}"]]}))
    (experiment / "searcher-state-2026-01-01_00-00-00.pkl").write_text("{}")
    listings, reads = [], []
    newest = layout.newest_driver_state
    read_bytes, read_json = storage.read_bytes, storage.read_json

    def listing(place):  # noqa: ANN001, ANN202
        listings.append(place)
        return newest(place)

    def reading(read):  # noqa: ANN001, ANN202
        return lambda place: reads.append(Path(storage.display(place)).name) or read(place)

    monkeypatch.setattr(layout, "newest_driver_state", listing)
    monkeypatch.setattr(preflight, "newest_driver_state", listing)
    monkeypatch.setattr(preflight, "read_bytes", reading(read_bytes))
    monkeypatch.setattr(storage, "read_json", reading(read_json))
    request = SweepRequest(name="exp", storage=str(tmp_path / "results"))
    preflight.check_resumable(request.storage, request.name)
    assert len(listings) == 1
    assert sorted(reads) == sorted([trial_list.name, "searcher-state-2026-01-01_00-00-00.pkl"])
    trial_list.write_text(json.dumps({"trial_data": [["[]", "{}"]]}))  # not Tune's trial list
    with pytest.raises(storage.DamagedFile, match=trial_list.name):
        preflight.check_resumable(request.storage, request.name)
