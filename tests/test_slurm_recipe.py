"""docs/examples/slurm_sweep.sh runs as written on a simulated two-node Slurm allocation on this
machine: its start lines (a Ray head, a worker joining it), its sweep line (one tiny ERM trial)
and its stop lines, with token authentication, every Ray process bound to 127.0.0.1. Its
choice of the head's address (HEAD_IP, HEAD_INTERFACE, else the first IPv4 address), the
resources of its Ray steps and its checks of the settings run in a fraction of a second on
stand-ins whose Ray head fails at once.

The simulation is the environment Slurm gives a batch script (SLURM_JOB_NODELIST,
SLURM_JOB_NUM_NODES, SLURM_CPUS_PER_TASK) and stand-ins on PATH: `scontrol show hostnames`
lists node1 and node2, `hostname --ip-address` says 127.0.0.1, and `srun` logs each step and
runs it here. The worker's `ray start` runs through `tests/ray_worker_node.py` (why: its
docstring); everything else runs as the script says. The script's site settings (data,
storage, name, GPUs per node, port) are given as the environment variables it reads."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import psutil
import pytest
import torch

from relif_ray import analysis
from relif_ray.config import ExperimentConfig
from relif_ray.engine import TrainingRun
from relif_ray.sweep.exit_status import EXIT_STOPPED
from tests.conftest import HANG_GUARD_S, TINY_DATA
from tests.local_cluster import free_port, listening_addresses
from tests.recipes import TABLE_1_SWEEP, what_it_trains
from tests.test_cluster_e2e import has_checkpoint
from tests.test_sweeps import trial_records

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
if [[ $1 == requeue ]]; then echo "requeue $2" >> "$SLURM_FAKE_LOG.scontrol"; exit 0; fi
[[ $1 == show && $2 == hostnames && $3 =~ ^node\\[([0-9]+)-([0-9]+)\\]$ ]] || exit 1
seq -f "node%g" "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
""",
    "hostname": """#!/bin/bash
echo 127.0.0.1
""",
}
TINY_SWEEP = ["--methods", "erm", "--seeds", "1", "--epochs", "8", "--backbone", "resnet18",
              "--batch-size", "6", "--lr", "1e-3", "--checkpoint-interval", "0",
              "--keep-checkpoints", "1", "--set", "train.optimizer=sgd"]  # fmt: skip
"""One ERM trial of 8 one-step epochs with a checkpoint each (SGD: less to write than Adam):
long enough to be stopped mid-way."""


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

    write_synthetic_nyuv2(tmp_path / "nyuv2", seed=0, **{**TINY_DATA, "train": 6, "val": 6})
    ray_tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    path = f"{fake_slurm(tmp_path / 'bin')}:{Path(sys.executable).parent}:{env['PATH']}"
    yield {
        **env,
        "PATH": path,
        "PYTHONPATH": str(REPO),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_CPUS_PER_TASK": "1",
        "SLURM_GPUS_ON_NODE": "0",
        "SLURM_FAKE_LOG": str(tmp_path / "srun.log"),
        "STAGE_DIR": str(tmp_path / "node-local"),  # the data's copy on "the node"
        "TUNE_GLOBAL_CHECKPOINT_S": "0",  # Tune saves its state every loop step: we wait on it
        "RAY_PORT": str(free_port()),
        "JOIN_WAIT": "120",
        "RAY_TMPDIR": ray_tmp,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # "this node" is 127.0.0.1 (local_cluster.py)
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    for process in ray_processes(ray_tmp):  # only if the script failed to stop them
        process.kill()
    shutil.rmtree(ray_tmp, ignore_errors=True)


def run_watching_sockets(
    env: dict[str, str],
    command: list[str],
    log: Path,
    signal_when: Callable[[], bool] | None = None,
) -> tuple[int, set[str]]:
    """Run the script with the sweep `command`; meanwhile collect the addresses its processes
    listen on, and send it USR1 (Slurm's early warning of the time limit) once `signal_when()`
    holds."""
    with log.open("w") as output:
        script = subprocess.Popen(
            ["bash", str(SCRIPT), *command], cwd=REPO, env=env, stdout=output,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    listening, deadline = set(), time.monotonic() + HANG_GUARD_S
    root = psutil.Process(script.pid)
    while script.poll() is None:
        assert time.monotonic() < deadline, "the Slurm script did not finish"
        listening |= set(listening_addresses(root))
        if signal_when is not None and signal_when():
            script.send_signal(signal.SIGUSR1)
            signal_when = None
        time.sleep(0.5)
    return script.returncode, listening


def running_with_a_checkpoint(experiment: Path) -> bool:
    """The trial runs and Tune's state records a checkpoint of it: mid-way."""
    return any(
        state["status"] == "RUNNING" and has_checkpoint(meta)
        for state, meta in trial_records(experiment)
    )


def assert_ray_stopped(ray_tmp: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while ray_processes(ray_tmp):  # the stop lines ended every Ray process
        assert time.monotonic() < deadline, ray_processes(ray_tmp)
        time.sleep(0.5)


@pytest.mark.slow
def test_a_preempted_job_stops_requeues_and_its_sweep_ends_with_uninterrupted_numbers(
    allocation, tmp_path
):
    """The job as Slurm runs it twice, with a sweep command of its own and its data staged to
    node-local disk: the first run copies the data to STAGE_DIR, starts Ray (a head, a worker
    joining it, one token, loopback only) and the sweep on the copy, gets USR1 mid-trial (the
    time limit's warning), stops the sweep gracefully (exit 75), requeues itself and stops
    Ray; the requeued run, on other nodes whose local disk lacks the copy, copies the data
    again and resumes the sweep, whose trial reads the copy and ends with the numbers of the
    same config trained here without interruption, step by step."""
    experiment = tmp_path / "results" / "slurm"
    data, copy = tmp_path / "nyuv2", Path(allocation["STAGE_DIR"]) / "nyuv2"
    command = ["python", "sweeps/nyuv2.py", "--data-dir", str(data), "--storage",
               str(tmp_path / "results"), "--name", "slurm", *TINY_SWEEP]  # fmt: skip
    returncode, listening = run_watching_sockets(
        allocation, command, tmp_path / "job.log", lambda: running_with_a_checkpoint(experiment)
    )
    assert returncode == EXIT_STOPPED, (tmp_path / "job.log").read_text()[-3000:]
    assert listening == {"127.0.0.1"}  # the head, the worker and the driver: loopback only
    assert (tmp_path / "srun.log.scontrol").read_text() == "requeue 4242\n"
    assert "resume with: " in (tmp_path / "job.log").read_text()
    steps = [line.split(" ", 3) for line in (tmp_path / "srun.log").read_text().splitlines()]
    port = allocation["RAY_PORT"]
    assert steps[0][3].startswith("--nodes=2 --ntasks=2 --ntasks-per-node=1 bash -c ")
    assert steps[0][3].endswith(f" stage {data} {copy}")
    assert [step[3] for step in steps[1:]] == [
        "--nodes=1 --ntasks=1 -w node1 hostname --all-ip-addresses",
        "--nodes=1 --ntasks=1 -w node1 --cpus-per-task=1 ray start --head --block "
        f"--node-ip-address=127.0.0.1 --port={port} --num-cpus=1 --num-gpus=0",
        "--nodes=1 --ntasks=1 --exclude=node1 --cpus-per-task=1 ray start --block "
        f"--address=127.0.0.1:{port} --num-cpus=1 --num-gpus=0",
    ]
    # token authentication: every step got the job's one 64-character token
    assert {tuple(step[:3]) for step in steps} == {("token", "64", steps[0][2])}
    assert_ray_stopped(allocation["RAY_TMPDIR"])
    assert analysis.load(experiment).trials.empty  # stopped mid-way: no finished trial

    shutil.rmtree(Path(allocation["STAGE_DIR"]))  # requeued onto nodes without the copy
    requeued = {**allocation, "SLURM_JOB_NODELIST": "node[3-4]"}
    (tmp_path / "srun.log").unlink()
    returncode, _ = run_watching_sockets(requeued, command, tmp_path / "requeued.log")
    assert returncode == 0, (tmp_path / "requeued.log").read_text()[-3000:]
    assert_ray_stopped(allocation["RAY_TMPDIR"])
    steps = (tmp_path / "srun.log").read_text().splitlines()
    assert steps[0].endswith(f" stage {data} {copy}") and "-w node3 " in steps[1]
    assert (Path(allocation["STAGE_DIR"]) / "nyuv2.relif-staged").read_text() == str(data)
    loaded = analysis.load(experiment)
    (row,) = [row for _, row in loaded.trials.iterrows()]
    assert row["label"] == "erm" and row["steps"] == 8
    assert row["config"]["data"]["root"] == str(copy)  # the trial read the node-local copy
    run = TrainingRun(ExperimentConfig.from_dict(row["config"]))
    assert torch.get_num_threads() == 1  # set in conftest.py, as in a 1-CPU trial
    while not run.finished:
        run.train_epoch()
    for name, value in run.evaluate("val").metrics.items():
        assert row[f"val_{name}"] == value, name
    trace = pd.DataFrame(run.trace)
    stored = loaded.trace(row["trial"]).drop(columns="trial")
    pd.testing.assert_frame_equal(stored[trace.columns], trace, check_exact=True)


SRUN_STEP = """echo "$*" >> "$SLURM_FAKE_LOG"
while [[ $# -gt 0 && $1 == -* ]]; do
    if [[ $1 == -w ]]; then shift; fi
    shift
done
"""
"""The stand-in sruns' start: log the step, then drop its options (`-w NODE` takes a value)."""

FAST_SLURM = {
    **FAKE_SLURM,
    "srun": """#!/bin/bash
# srun that logs each step and runs only its `hostname` and `ip` commands: a Ray step fails at
# once, so the script stops at its first check of the head, before any Ray runs.
"""
    + SRUN_STEP
    + """if [[ $1 == ray ]]; then exit 1; fi
exec "$@"
""",
    "hostname": """#!/bin/bash
echo "fe80::1 127.0.0.4 127.0.0.5"
""",
    "ip": """#!/bin/bash
[[ "$*" == "-4 -o addr show dev ib0" ]] || exit 1
echo "4: ib0    inet 127.0.0.3/16 brd 127.0.255.255 scope global ib0\\       valid_lft forever"
""",
}
"""Stand-ins that run the script up to its Ray head, in a fraction of a second. The addresses
are loopback ones (a connection to them is refused at once): a multi-network node's first
IPv4 address, 127.0.0.4, and the address of its interface ib0, 127.0.0.3."""


def start_lines(tmp_path: Path, **settings: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run the script on a simulated allocation whose Ray head fails to start: its output and
    the steps it started."""
    folder = tmp_path / "bin"
    folder.mkdir(parents=True)
    for name, text in FAST_SLURM.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    log = tmp_path / "srun.log"
    log.touch()
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env.update(
        PATH=f"{folder}:{Path(sys.executable).parent}:{env['PATH']}", SLURM_JOB_ID="7",
        SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_NUM_NODES="2", SLURM_CPUS_PER_TASK="32",
        SLURM_GPUS_ON_NODE="8", SLURM_FAKE_LOG=str(log), RAY_PORT=str(free_port()),
        RAY_TMPDIR=str(tmp_path / "ray"), **settings,
    )  # fmt: skip
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    return done, log.read_text().splitlines()


@pytest.mark.parametrize(
    ("settings", "address_step", "head_ip"),
    [
        ({}, "hostname --all-ip-addresses", "127.0.0.4"),
        ({"HEAD_INTERFACE": "ib0"}, "ip -4 -o addr show dev ib0", "127.0.0.3"),
        ({"HEAD_IP": "127.0.0.2", "HEAD_INTERFACE": "ib0"}, None, "127.0.0.2"),
    ],
)
@pytest.mark.slow
def test_the_head_address_is_the_given_one_the_interfaces_or_the_first_ipv4(
    tmp_path, settings, address_step, head_ip
):
    """HEAD_IP wins, then HEAD_INTERFACE's address, then the head node's first IPv4 address;
    the Ray steps ask for their node's CPUs and GPUs themselves."""
    done, steps = start_lines(tmp_path, **settings)
    assert done.returncode == 1 and "exited before listening" in done.stderr, done.stderr
    assert f"the Ray head is {head_ip}:" in done.stdout
    expected = [f"--nodes=1 --ntasks=1 -w node1 {address_step}"] if address_step else []
    assert steps[:-1] == expected
    assert steps[-1].startswith(
        "--nodes=1 --ntasks=1 -w node1 --cpus-per-task=32 --gpus-per-node=8 ray start --head "
        f"--block --node-ip-address={head_ip} "
    )


def test_an_interface_without_an_ipv4_address_or_a_bad_wait_is_one_line(tmp_path):
    done, steps = start_lines(tmp_path / "a", HEAD_INTERFACE="eth9")
    assert done.returncode == 1 and steps == ["--nodes=1 --ntasks=1 -w node1 ip -4 -o addr "
                                              "show dev eth9"]  # fmt: skip
    assert done.stderr == (
        "slurm_sweep.sh: no IPv4 address for the Ray head on node1 (interface eth9)\n"
    )
    for name in ("JOIN_WAIT", "HEAD_WAIT"):
        done, steps = start_lines(tmp_path / name, **{name: "5m"})
        assert done.returncode == 1 and steps == []
        assert done.stderr == (
            f"slurm_sweep.sh: {name} must be a whole number of seconds, got '5m'\n"
        )


QUICK_SLURM = {
    **FAST_SLURM,
    "srun": """#!/bin/bash
# srun that logs each step and runs it here, with stand-ins for Ray: the head listens on its
# port until it is stopped, a worker waits until it is stopped.
"""
    + SRUN_STEP
    + """if [[ $1 == ray && " $* " == *" --head "* ]]; then
    port=$(printf '%s\\n' "$@" | sed -n 's/^--port=//p')
    exec "$REAL_PYTHON" -c "import socket, sys, time
s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(600)" "$port"
fi
if [[ $1 == ray ]]; then exec sleep 600; fi
exec "$@"
""",
    "hostname": "#!/bin/bash\necho 127.0.0.1\n",
    "python": """#!/bin/bash
# python: the script's own snippets run (the token; the wait for the nodes is skipped), the
# sweep's command line is logged instead of run.
if [[ $1 == -c ]]; then exec "$REAL_PYTHON" "$@"; fi
if [[ $1 == - ]]; then cat > /dev/null; exit 0; fi
printf '%s\\n' "python $*" >> "$SLURM_FAKE_LOG.sweep"
""",
    "relif": """#!/bin/bash
printf '%s\\n' "relif $*" >> "$SLURM_FAKE_LOG.sweep"
""",
}
"""Stand-ins that run the script through its sweep line in a second: the Ray steps wait to be
stopped, and the sweep command is only logged (`$SLURM_FAKE_LOG.sweep`)."""


def sweep_line(tmp_path: Path, command: list[str], **settings: str) -> subprocess.CompletedProcess:
    """Run the script with `command` on the quick stand-ins (two nodes of 8 GPUs)."""
    folder = tmp_path / "bin"
    folder.mkdir(parents=True)
    for name, text in QUICK_SLURM.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    log = tmp_path / "srun.log"
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env.update(
        PATH=f"{folder}:{env['PATH']}", REAL_PYTHON=sys.executable, SLURM_JOB_ID="7",
        SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_NUM_NODES="2", SLURM_CPUS_PER_TASK="32",
        SLURM_GPUS_ON_NODE="8", SLURM_FAKE_LOG=str(log), RAY_PORT=str(free_port()),
        RAY_TMPDIR=str(tmp_path / "ray"), **settings,
    )  # fmt: skip
    return subprocess.run(
        ["bash", str(SCRIPT), *command], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=HANG_GUARD_S,
    )  # fmt: skip


def test_without_a_command_the_script_runs_the_table_1_sweep(tmp_path):
    """The default command is the Table 1 one (`tests/recipes.py`), with the allocation's
    address, GPU count and --resume-if-present added."""
    done = sweep_line(tmp_path, [])
    assert done.returncode == 0, done.stderr
    (line,) = (tmp_path / "srun.log.sweep").read_text().splitlines()
    port = re.search(r"--address 127\.0\.0\.1:(\d+) ", line)[1]
    assert what_it_trains(line) == what_it_trains(TABLE_1_SWEEP)
    assert line.endswith(f" --address 127.0.0.1:{port} --num-gpus 16 --resume-if-present")


@pytest.mark.parametrize(
    "command",
    [
        "python sweeps/tabular.py --preset actg175 --storage /nfs/relif-results --name actg175",
        "python sweeps/controller_sensitivity.py --dataset mimic3 --data-dir /data/mimic3",
        "relif sweep --dataset eicu --data-dir /data/eicu --methods erm,relif",
    ],
)
@pytest.mark.slow
def test_any_sweep_command_runs_as_given(tmp_path, command):
    done = sweep_line(tmp_path, shlex.split(command))
    assert done.returncode == 0, done.stderr
    (line,) = (tmp_path / "srun.log.sweep").read_text().splitlines()
    assert line.startswith(f"{command} --address 127.0.0.1:")
    assert line.endswith(" --num-gpus 16 --resume-if-present")


def test_stage_dir_copies_the_data_once_per_node_and_the_sweep_reads_the_copy(tmp_path):
    """With STAGE_DIR, one task per node copies the command's data (a folder for --data-dir, a
    file for --data) there, and the sweep's flag names the copy; a later job on the same node
    finds the finished copy of the same source and copies nothing."""
    source = tmp_path / "cohort.csv"
    source.write_text("died,sex\n0,f\n")
    stage = tmp_path / "local"
    command = ["python", "sweeps/tabular.py", "--data", str(source), "--task", "death=died:binary"]
    done = sweep_line(tmp_path / "job", command, STAGE_DIR=str(stage))
    assert done.returncode == 0, done.stderr
    copy = stage / "cohort.csv"
    assert copy.read_text() == source.read_text()
    assert f"slurm_sweep.sh: staged {source} to {copy} on every node" in done.stdout
    (step,) = [s for s in (tmp_path / "job" / "srun.log").read_text().splitlines() if "stage" in s]
    assert step.startswith("--nodes=2 --ntasks=2 --ntasks-per-node=1 bash -c ")
    (line,) = (tmp_path / "job" / "srun.log.sweep").read_text().splitlines()
    assert line.startswith(f"python sweeps/tabular.py --data {copy} --task death=died:binary ")
    source.write_text("changed at the source\n")  # a finished copy of this source is kept
    again = sweep_line(tmp_path / "again", command, STAGE_DIR=str(stage))
    assert again.returncode == 0 and copy.read_text() == "died,sex\n0,f\n", again.stderr


@pytest.mark.parametrize(
    ("command", "settings", "message"),
    [
        (["--methods", "erm"], {}, "the arguments are the sweep command (python sweeps/NAME.py "
         "...), got '--methods' first"),
        (["python", "sweeps/nyuv2.py", "--num-gpus", "4"], {},
         "--num-gpus is set by the script (from the allocation), not by the sweep command"),
        (["python", "sweeps/nyuv2.py", "--address=auto"], {},
         "--address is set by the script (from the allocation), not by the sweep command"),
        (["python", "sweeps/tabular.py", "--preset", "actg175"], {"STAGE_DIR": "/tmp/x"},
         "STAGE_DIR is set, but the sweep command names no one --data-dir or --data to copy"),
        (["python", "sweeps/nyuv2.py", "--data-dir", "/no/such/data"], {"STAGE_DIR": "/tmp/x"},
         "--data-dir /no/such/data: no such file or folder to stage"),
    ],
)  # fmt: skip
def test_a_command_the_script_cannot_run_is_one_line_before_any_step(
    tmp_path, command, settings, message
):
    done = sweep_line(tmp_path, command, **settings)
    assert done.returncode == 1 and done.stderr == f"slurm_sweep.sh: {message}\n"
    assert not (tmp_path / "srun.log").exists()


def test_the_script_asks_for_memory_and_lists_the_ports_ray_uses():
    """`#SBATCH --mem` is set, the join deadline is JOIN_WAIT's (no fixed number of seconds),
    and the header lists Ray's ports, naming only `ray start` flags that exist."""
    from ray.scripts.scripts import start

    text = SCRIPT.read_text()
    assert re.search(r"^#SBATCH --mem=\S+", text, re.M)
    assert "deadline = time.monotonic() + float(sys.argv[3])" in text
    assert '"$JOIN_WAIT" <<' in text
    header = text.split("set -euo pipefail")[0]
    for port in ("RAY_PORT (6379)", "10001", "8265", "52365", "10002-19999"):
        assert port in header, port
    flags = set(re.findall(r"--[a-z-]+-port\b", header))
    known = {option for parameter in start.params for option in parameter.opts}
    assert len(flags) >= 7 and flags <= known, flags - known
