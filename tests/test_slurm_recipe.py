"""docs/examples/slurm_sweep.sh runs as written on a simulated two-node Slurm allocation on this
machine: its start lines (a Ray head, a worker joining it), its sweep line (one tiny ERM trial)
and its stop lines, with token authentication, every Ray process bound to 127.0.0.1.

The simulation is the environment Slurm gives a batch script (SLURM_JOB_NODELIST,
SLURM_JOB_NUM_NODES, SLURM_CPUS_PER_TASK) and stand-ins on PATH: `scontrol show hostnames`
lists node1 and node2, `hostname --ip-address` says 127.0.0.1, and `srun` logs each step and
runs it here. The worker's `ray start` runs through `tests/ray_worker_node.py` (why: its
docstring); everything else runs as the script says. The script's site settings (data,
storage, name, GPUs per node, port) are given as the environment variables it reads."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

import analysis
from tests.conftest import TINY_DATA
from tests.local_cluster import free_port, listening_addresses

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "docs" / "examples" / "slurm_sweep.sh"
FAKE_SLURM = {
    "srun": """#!/bin/bash
# srun on the simulated allocation: every node is this machine. Logs the step (the auth mode,
# a hash of the token, the arguments), drops srun's options and runs the command.
token=$(printf %s "$RAY_AUTH_TOKEN" | sha256sum | cut -c1-16)
echo "$RAY_AUTH_MODE ${#RAY_AUTH_TOKEN} $token $*" >> "$SLURM_FAKE_LOG"
while [[ $# -gt 0 && $1 == -* ]]; do
    if [[ $1 == -w ]]; then shift; fi
    shift
done
if [[ $1 == ray && $2 == start && " $* " != *" --head "* ]]; then
    shift 2
    exec python -m tests.ray_worker_node "$@"
fi
exec "$@"
""",
    "scontrol": """#!/bin/bash
[[ $1 == show && $2 == hostnames ]] || exit 1
seq -f "node%g" 1 "$SLURM_JOB_NUM_NODES"
""",
    "hostname": """#!/bin/bash
echo 127.0.0.1
""",
}
TINY_SWEEP = ["--methods", "erm", "--seeds", "1", "--epochs", "1", "--backbone", "resnet18",
              "--batch-size", "6", "--lr", "1e-3"]  # fmt: skip


def fake_slurm(folder: Path) -> Path:
    folder.mkdir()
    for name, text in FAKE_SLURM.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def ray_processes(ray_tmp: str) -> list[psutil.Process]:
    """This machine's processes of the Ray under `ray_tmp` (their command lines name it)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(ray_tmp in part for part in process.info["cmdline"] or []):
            found.append(process)
    return found


@pytest.fixture
def allocation(tmp_path) -> dict[str, str]:
    """The batch script's environment on the simulated allocation, with its site settings."""
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2

    data = write_synthetic_nyuv2(tmp_path / "data", seed=0, **{**TINY_DATA, "train": 6, "val": 6})
    ray_tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    path = f"{fake_slurm(tmp_path / 'bin')}:{Path(sys.executable).parent}:{env['PATH']}"
    yield {
        **env,
        "PATH": path,
        "PYTHONPATH": str(REPO),
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_CPUS_PER_TASK": "1",
        "SLURM_FAKE_LOG": str(tmp_path / "srun.log"),
        "DATA_DIR": str(data),
        "STORAGE": str(tmp_path / "results"),
        "NAME": "slurm",
        "GPUS_PER_NODE": "0",
        "RAY_PORT": str(free_port()),
        "RAY_TMPDIR": ray_tmp,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # "this node" is 127.0.0.1 (local_cluster.py)
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    for process in ray_processes(ray_tmp):  # only if the script failed to stop them
        process.kill()
    shutil.rmtree(ray_tmp, ignore_errors=True)


def run_watching_sockets(env: dict[str, str], log: Path) -> tuple[int, set[str]]:
    """Run the script; meanwhile collect the addresses its processes listen on."""
    with log.open("w") as output:
        script = subprocess.Popen(
            ["bash", str(SCRIPT), *TINY_SWEEP], cwd=REPO, env=env, stdout=output,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    listening, deadline = set(), time.monotonic() + 400
    root = psutil.Process(script.pid)
    while script.poll() is None:
        assert time.monotonic() < deadline, "the Slurm script did not finish"
        listening |= set(listening_addresses(root))
        time.sleep(0.5)
    return script.returncode, listening


def test_the_slurm_script_starts_ray_sweeps_and_stops_ray(allocation, tmp_path):
    returncode, listening = run_watching_sockets(allocation, tmp_path / "job.log")
    assert returncode == 0, (tmp_path / "job.log").read_text()[-3000:]
    assert listening == {"127.0.0.1"}  # the head, the worker and the driver: loopback only
    steps = [line.split(" ", 3) for line in (tmp_path / "srun.log").read_text().splitlines()]
    port = allocation["RAY_PORT"]
    assert [step[3] for step in steps] == [
        "--nodes=1 --ntasks=1 -w node1 hostname --ip-address",
        f"--nodes=1 --ntasks=1 -w node1 ray start --head --block --node-ip-address=127.0.0.1 "
        f"--port={port} --num-cpus=1 --num-gpus=0",
        f"--nodes=1 --ntasks=1 --exclude=node1 ray start --block --address=127.0.0.1:{port} "
        "--num-cpus=1 --num-gpus=0",
    ]
    # token authentication: every step got the job's one 64-character token
    assert {tuple(step[:3]) for step in steps} == {("token", "64", steps[0][2])}
    trials = analysis.load(Path(allocation["STORAGE"]) / "slurm").trials
    assert list(trials["label"]) == ["erm"] and trials["val_worst"].notna().all()
    deadline = time.monotonic() + 60
    while ray_processes(allocation["RAY_TMPDIR"]):  # the stop lines ended every Ray process
        assert time.monotonic() < deadline, ray_processes(allocation["RAY_TMPDIR"])
        time.sleep(0.5)
