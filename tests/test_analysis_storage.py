"""Experiments and score files in object storage: `analysis.load`, `relif report` and
`relif audit` read `s3://` (an S3 API served by moto on 127.0.0.1), `file://` and local paths
alike, and give the same numbers as the local copy."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from relif_ray import analysis
from relif_ray.cli import main as relif_main
from relif_ray.errors import UserError
from relif_ray.experiment import storage
from tests.conftest import BUCKET


def comparable(trials: pd.DataFrame) -> pd.DataFrame:
    """Trials without the columns that name where they were read from."""
    return trials.drop(columns=["experiment", "path"]).reset_index(drop=True)


def test_load_reads_s3_like_the_local_copy(s3: dict):
    local = analysis.load(s3["local"] / "nyuv2")
    remote = analysis.load(f"s3://{BUCKET}/results/nyuv2")
    pd.testing.assert_frame_equal(comparable(remote.trials), comparable(local.trials))
    pd.testing.assert_frame_equal(remote.scores, local.scores)
    pd.testing.assert_frame_equal(remote.traces, local.traces)
    trial = local.trials["trial"].iloc[-1]
    for got, expected in zip(
        remote.representations(trial), local.representations(trial), strict=True
    ):
        np.testing.assert_array_equal(got, expected)
    assert remote.trials["experiment"].unique().tolist() == [f"s3://{BUCKET}/results/nyuv2"]
    assert all(p.startswith(f"s3://{BUCKET}/results/nyuv2/") for p in remote.trials["path"])
    assert sorted(remote.problems["status"]) == ["errored", "incomplete"]
    assert remote.problems["error"].tolist() == local.problems["error"].tolist()


def test_endpoint_options_in_the_uri_instead_of_the_environment(s3: dict, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    uri = f"s3://{BUCKET}/results/nyuv2?endpoint_override={s3['host']}&scheme=http"
    remote = analysis.load(uri)
    local = analysis.load(s3["local"] / "nyuv2")
    pd.testing.assert_frame_equal(comparable(remote.trials), comparable(local.trials))
    assert remote.trials["experiment"].iloc[0] == f"s3://{BUCKET}/results/nyuv2"
    trial = local.trials["trial"].iloc[0]
    pd.testing.assert_frame_equal(remote.trace(trial), local.trace(trial))


def test_file_uri_is_a_local_path(s3_server: dict):
    directory = s3_server["local"] / "nyuv2"
    from_uri = analysis.load(directory.as_uri())
    pd.testing.assert_frame_equal(from_uri.trials, analysis.load(directory).trials)
    assert from_uri.paths == [directory]


def test_missing_s3_directory_is_a_one_line_error(s3: dict):
    with pytest.raises(UserError, match=f"^experiment directory not found: s3://{BUCKET}/nope$"):
        analysis.load(f"s3://{BUCKET}/nope")


@pytest.mark.slow
def test_report_of_s3_equals_the_report_of_the_local_copy(s3: dict, tmp_path: Path, capsys):
    outputs = {}
    for name, source in (
        ("local", str(s3["local"] / "nyuv2")),
        ("s3", f"s3://{BUCKET}/results/nyuv2"),
    ):
        out = tmp_path / name
        argv = ["report", source, "--out", str(out), "--n-boot", "20", "--no-figures"]
        assert relif_main(argv) == 0
        outputs[name] = out
    assert capsys.readouterr().err == ""
    local, remote = outputs["local"], outputs["s3"]
    tables = sorted(p.relative_to(local) for p in local.rglob("*.csv"))
    assert Path("tables/main.csv") in tables and Path("per_trial.csv") in tables
    assert sorted(p.relative_to(remote) for p in remote.rglob("*.csv")) == tables
    for table in tables:
        pd.testing.assert_frame_equal(pd.read_csv(remote / table), pd.read_csv(local / table))
    for name in ("main", "utility", "drift"):
        assert (remote / f"tables/{name}.md").read_text() == (
            local / f"tables/{name}.md"
        ).read_text()
    assert json.loads((remote / "delta_ref.json").read_text()) == json.loads(
        (local / "delta_ref.json").read_text()
    )
    report = (remote / "report.md").read_text()
    assert f"Experiment directories: `s3://{BUCKET}/results/nyuv2`" in report
    assert f"`s3://{BUCKET}/results/nyuv2/ReLiFTrainable_" in report  # problems listed by URI


@pytest.mark.parametrize("name", ["scores.parquet", "scores.csv"])
def test_audit_reads_a_score_file_in_s3(s3: dict, name: str, capsys):
    flags = ["--delta", "0.2", "--pairs", "300", "--split", "val", "--json"]
    assert relif_main(["audit", str(s3["local"] / "scores" / name), *flags]) == 0
    local = json.loads(capsys.readouterr().out)
    assert relif_main(["audit", f"s3://{BUCKET}/results/scores/{name}", *flags]) == 0
    assert json.loads(capsys.readouterr().out) == local
    assert set(local["pairs"]) == {"a|b"}


def test_audit_reads_a_file_uri(s3_server: dict, capsys):
    path = s3_server["local"] / "scores" / "scores.csv"
    flags = ["--delta", "0.2", "--pairs", "300", "--split", "test", "--json"]
    assert relif_main(["audit", str(path), *flags]) == 0
    local = capsys.readouterr().out
    assert relif_main(["audit", path.as_uri(), *flags]) == 0
    assert capsys.readouterr().out == local


def test_audit_of_a_missing_s3_file_is_a_one_line_error(s3: dict, capsys):
    uri = f"s3://{BUCKET}/results/scores/none.parquet"
    assert relif_main(["audit", uri, "--delta", "0.2"]) == 2
    assert capsys.readouterr().err == f"relif: error: {uri}: no such file\n"


def test_uri_helpers_keep_the_filesystem_options():
    uri = "s3://bucket/runs?endpoint_override=127.0.0.1:9000&scheme=http"
    trial = storage.join(uri, "trial_1", "checkpoint_000002")
    assert (
        trial
        == "s3://bucket/runs/trial_1/checkpoint_000002?endpoint_override=127.0.0.1:9000&scheme=http"
    )
    assert storage.parent(storage.parent(trial)) == uri
    assert storage.display(trial) == "s3://bucket/runs/trial_1/checkpoint_000002"
    assert storage.location("file:///tmp/runs") == Path("/tmp/runs")
    assert storage.location("runs/nyuv2") == Path("runs/nyuv2")
    assert storage.join(Path("/tmp/runs"), "a", "b") == Path("/tmp/runs/a/b")


def test_storage_decides_once_that_file_uris_are_local(tmp_path):
    """`relif_ray.experiment.storage` is the one place that tells local from object storage:
    a `file://` URI is the local directory it names, for the lock, the checks and Ray alike."""
    assert storage.local_path(tmp_path.as_uri()) == tmp_path.resolve()
    assert storage.local_path(str(tmp_path)) == tmp_path.resolve()
    assert storage.resolved(tmp_path.as_uri()) == tmp_path.resolve()
    assert storage.local_path("s3://bucket/results") is None
    assert storage.resolved("s3://bucket/results?scheme=http") == "s3://bucket/results?scheme=http"


def test_credentials_of_an_s3_uri_leave_it_for_the_environment(monkeypatch):
    """`s3://KEY:SECRET@bucket/...` (percent-encoded, as Arrow reads it) is the URI without
    them; they become this process's AWS credentials, in place of those there (and of their
    session token); messages and command lines never show them."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "before")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "before")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "of-before")
    uri = "s3://AK%2B1:s%2Fe%2Bcret@bucket/runs?endpoint_override=127.0.0.1:9000&scheme=http"
    place = storage.location(uri, "--storage")
    assert place == "s3://bucket/runs?endpoint_override=127.0.0.1:9000&scheme=http"
    assert (os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]) == (
        "AK+1",
        "s/e+cret",
    )
    assert "AWS_SESSION_TOKEN" not in os.environ
    assert storage.display(uri) == "s3://bucket/runs"
    line = f"sweeps/nyuv2.py --storage {uri} --set=x=s3://k:v@b/c"
    assert storage.redacted(line) == (
        "sweeps/nyuv2.py --storage s3://bucket/runs?endpoint_override=127.0.0.1:9000&scheme=http"
        " --set=x=s3://b/c"
    )
    for bad, error in [
        ("gs://key:secret@bucket/runs", "--storage gs://bucket/runs: a gs:// URI takes no"),
        ("s3://secret@bucket/runs", "--storage s3://bucket/runs: credentials in an s3:// URI"),
        ("ftp://key:secret@host/runs", "--storage ftp://host/runs: unsupported storage"),
    ]:
        with pytest.raises(UserError, match="^" + re.escape(error)) as raised:
            storage.location(bad, "--storage")
        assert "secret" not in str(raised.value)
