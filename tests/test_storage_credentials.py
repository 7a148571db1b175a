"""Credentials given in a storage URI (`s3://KEY:SECRET@bucket/...`) are never written: a sweep
and its resume on an S3 store (moto on 127.0.0.1), each with its own local Ray, then `relif
export`, `relif report` and `relif audit` of the experiment, taking the credentials again from
the URI or from the environment; the key and the secret are in no byte of the store, of the
folders the commands wrote (Ray's session folder, temporary and home folders, the export and
the report) or of what the commands printed, in clear or hex-encoded (as Ray Tune's state
holds a pickle).

The sweep is the tabular one on the synthetic table: what the store and the commands handle
does not depend on the data set, and its trials' checkpoints are kilobytes, not ResNet-18's
150 MB read back from moto byte by byte."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pyarrow.fs as pafs
import pytest

from relif_ray.data.synthetic_tabular import DEMO_SPEC, TABLE, write_synthetic_table
from tests.conftest import BUCKET, HANG_GUARD_S, ONE_TRIAL_AT_A_TIME

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
KEY = f"RELIFKEY{uuid.uuid4().hex[:12].upper()}"
SECRET = f"relif/secret+{uuid.uuid4().hex}"
"""A fresh secret each run, with the characters an AWS secret can hold that a URI encodes."""
QUOTED = quote(SECRET, safe="")
"""The secret as the URI holds it."""
NEEDLES = [word.encode() for word in (KEY, SECRET, QUOTED)]
NEEDLES += [needle.hex().encode() for needle in NEEDLES]


def leaks(data: bytes) -> list[bytes]:
    return [needle for needle in NEEDLES if needle in data]


def files_holding_it(folder: Path) -> list[str]:
    """The files below `folder` that hold the key or the secret."""
    found = []
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink() and leaks(path.read_bytes()):
            found.append(str(path))
    return found


@pytest.fixture
def scratch() -> Iterator[Path]:
    """Ray's and every other temporary folder of the commands, and their home folder: short,
    under /tmp (Ray's socket paths)."""
    folder = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def run(argv: list[str], scratch: Path, **env: str) -> subprocess.CompletedProcess:
    """One command of ours, in an environment without AWS credentials (plus `env`)."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    (scratch / "home").mkdir(exist_ok=True)
    (scratch / "tmp").mkdir(exist_ok=True)
    places = {"RAY_TMPDIR": str(scratch), "TMPDIR": str(scratch / "tmp")}
    return subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        capture_output=True,
        env={
            **clean,
            **places,
            "HOME": str(scratch / "home"),
            "PYTHONPATH": str(REPO),
            "RAY_USAGE_STATS_ENABLED": "0",
            "AWS_EC2_METADATA_DISABLED": "true",
            **env,
        },
        timeout=HANG_GUARD_S,
    )


def test_credentials_in_a_storage_uri_are_written_nowhere(
    s3_server: dict, scratch: Path, tmp_path: Path
):
    options = f"endpoint_override={s3_server['host']}&scheme=http&region=us-east-1"
    uri = f"s3://{KEY}:{QUOTED}@{BUCKET}/sealed?{options}"
    table = write_synthetic_table(tmp_path / "table", rows=60, seed=0) / TABLE
    spec = [flag for task in DEMO_SPEC["tasks"] for flag in ("--task", task)]
    spec += [flag for group in DEMO_SPEC["groups"] for flag in ("--group", group)]
    sweep = [
        "sweeps/tabular.py", "--data", str(table), *spec, "--storage", uri, "--name", "exp",
        "--methods", "erm", "--seeds", "1", "--epochs", "2", "--batch-size", "16",
        "--num-cpus", "1", *ONE_TRIAL_AT_A_TIME,
    ]  # fmt: skip
    outputs = []
    for argv in (sweep, [*sweep, "--resume"]):
        done = run(argv, scratch)
        outputs.append(done)
        assert done.returncode == 0, done.stderr.decode()[-3000:]
    experiment = f"s3://{KEY}:{QUOTED}@{BUCKET}/sealed/exp?{options}"
    exported = tmp_path / "exported"
    done = run(["-m", "relif_ray.cli", "export", experiment, str(exported)], scratch)
    outputs.append(done)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    (params,) = exported.glob("erm*/params.json")  # the trial's config names the store so
    assert json.loads(params.read_text())["experiment_dir"] == f"s3://{BUCKET}/sealed/exp?{options}"
    # the credentials in the environment, the URI without them
    from_env = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
    plain = f"s3://{BUCKET}/sealed/exp?{options}"
    report = ["-m", "relif_ray.cli", "report", plain, "--out", str(tmp_path / "report")]
    done = run(report, scratch, **from_env)
    outputs.append(done)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    client = pafs.S3FileSystem(
        endpoint_override=s3_server["host"], scheme="http", region="us-east-1",
        access_key="testing", secret_key="testing",
    )  # fmt: skip
    objects = [
        info.path
        for info in client.get_file_info(pafs.FileSelector(BUCKET, recursive=True))
        if info.is_file
    ]
    # a score file of the store (the sweep's regression scores are raw, the audit takes [0, 1])
    scores = f"{BUCKET}/results/scores/scores.parquet"
    audit = ["audit", f"s3://{KEY}:{QUOTED}@{scores}?{options}", "--delta", "0.2"]
    done = run(["-m", "relif_ray.cli", *audit, "--split", "test"], scratch)
    outputs.append(done)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert f"fixed-delta audit of s3://{scores}?{options}" in done.stdout.decode()

    assert any(path.endswith("/params.json") for path in objects)
    assert any("/experiment_state-" in path for path in objects)
    in_store = []
    for path in objects:
        # one GET per object: a stream reads in ranged GETs, each of which moto serves from a
        # copy of the whole object (minutes for a 150-MB checkpoint)
        with client.open_input_file(path) as whole:
            if leaks(whole.read()):
                in_store.append(path)
    assert in_store == []
    assert list(scratch.glob("ray/session_*/logs")), "the sweeps' Ray wrote no session folder here"
    assert files_holding_it(scratch) == []
    assert files_holding_it(tmp_path) == []
    printed = [(done.args, leaks(done.stdout + done.stderr)) for done in outputs]
    assert [(argv, found) for argv, found in printed if found] == []
