"""What a sweep survives (docs/cluster.md, "What survives what"): real sweep drivers, started
as a requeued job starts them (the same command, with `--resume-if-present`, every time), on
the session's Ray (tests/conftest.py), meet a killed trial worker, a full disk, a stop signal
and a second one, while `relif report` and `relif export` read the experiment in a loop; a
sweep on s3:// (moto on 127.0.0.1) meets an outage of its store. Every trial ends with the
numbers of the same config trained here without interruption, field by field and step by
step (float reductions depend on the thread count: one here, as in a 1-CPU trial)."""

from __future__ import annotations

import io
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow.fs as pafs
import pytest

from relif_ray import analysis
from relif_ray.cli import main as relif_main
from relif_ray.experiment import storage
from relif_ray.experiment.outputs import read_trial_info
from relif_ray.sweep.exit_status import EXIT_STOPPED
from relif_ray.tuning.trainable import STATE_FILE, readable_state
from tests.conftest import HANG_GUARD_S
from tests.local_cluster import LOCALHOST, free_port
from tests.test_cluster_e2e import (
    assert_uninterrupted_numbers,
    has_checkpoint,
    trained_here,
    wait_for,
)
from tests.test_sweeps import driver_env, trial_records

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
EPOCHS = 6
FILE_SIZE_LIMIT = 20_000_000
"""Bytes a trial worker may write to one file once its disk is "full": its outputs fit, the
checkpoint state of a ResNet-18 with SGD's momentum (about 100 MB) does not."""
OUTAGE_BUCKET = "relif-outage"
COMPARED = ["worst", "macro", "seg_miou", "depth_rmse", "normal_angle_mean"]
"""Columns of the report's per_trial.csv that are the trial's own numbers."""


def sweep_argv(data: Path, storage: str, address: str, **flags: object) -> list[str]:
    """ERM seeds 0 and 1, one after the other, 6 epochs of 2 steps with a checkpoint each (SGD:
    a third less to write than with Adam's two moments); one retry per trial (`flags`, by name
    without the dashes, replace these); the same command for a first start and every requeue."""
    defaults = {
        "data_dir": data, "methods": "erm", "seeds": 2, "epochs": EPOCHS,
        "backbone": "resnet18", "batch_size": 6, "lr": 1e-3, "storage": storage,
        "name": "survives", "address": address, "max_concurrent_trials": 1,
        "checkpoint_interval": 0, "keep_checkpoints": 1, "max_failures": 1,
        "set": "train.optimizer=sgd",
    }  # fmt: skip
    given = {**defaults, **flags}
    words = [word for flag, value in given.items() for word in (f"--{flag}", str(value))]
    return [word.replace("_", "-") if word.startswith("--") else word for word in words] + [
        "--resume-if-present"
    ]


@dataclass
class Driver:
    """One run of the sweep script, its stdout and stderr in files."""

    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=driver_env)
    process: subprocess.Popen = field(init=False)

    def __post_init__(self) -> None:
        with self.log.with_suffix(".out").open("w") as out, self.log.open("w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "sweeps/nyuv2.py", *self.argv],
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    def wait(self) -> int:
        try:
            return self.process.wait(timeout=HANG_GUARD_S)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)

    def stopped_line(self) -> str:
        """The one line that says how the sweep stopped."""
        lines = [line for line in self.log.read_text().splitlines() if line.startswith("sweep ")]
        assert len(lines) == 1, self.log.read_text()[-3000:]
        return lines[0]


def seed_record(experiment: Path, seed: int) -> tuple[dict, dict] | None:
    """(state, runtime metadata) of the trial of `seed` in Tune's latest experiment state."""
    for state, meta in trial_records(experiment):
        if state["config"]["seed"] == seed:
            return state, meta
    return None


def status_of(experiment: Path, seed: int) -> str | None:
    """The status of the trial of `seed` in Tune's latest experiment state (None while none is
    readable)."""
    record = seed_record(experiment, seed)
    return record[0]["status"] if record else None


def running_with_checkpoint(experiment: Path, seed: int, not_pid: int = 0) -> int | None:
    """The worker process of the trial of `seed` while it runs with a checkpoint (and a result
    from a process other than `not_pid`)."""
    record = seed_record(experiment, seed)
    if record is None:
        return None
    state, meta = record
    pid = meta["last_result"].get("pid")
    if state["status"] == "RUNNING" and has_checkpoint(meta) and pid and pid != not_pid:
        return pid
    return None


@dataclass(eq=False)
class Reader(threading.Thread):
    """`relif report` and `relif export` of the experiment every 2 s while the sweep runs: each
    call's exit status and stderr, the trial numbers each report had and the trial records
    each export copied."""

    experiment: Path
    folder: Path
    calls: list[tuple[str, int, str]] = field(default_factory=list)
    rows: list[pd.DataFrame] = field(default_factory=list)
    exported: list[dict] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        super().__init__(daemon=True)

    def run(self) -> None:
        try:
            self.read()
        except BaseException as error:  # the test asserts there was none
            self.error = error

    def read(self) -> None:
        while not self.done.wait(2.0):
            out, copy = self.folder / "report", self.folder / "copy"
            report = ["report", str(self.experiment), "--out", str(out), "--no-figures"]
            self.call([*report, "--n-boot", "0"])
            if (out / "per_trial.csv").exists():
                self.rows.append(  # floats exactly as written: they are compared with ==
                    pd.read_csv(
                        out / "per_trial.csv", dtype={"trial": str}, float_precision="round_trip"
                    )
                )
            if self.call(["export", str(self.experiment), str(copy)]) == 0:
                self.exported += [read_trial_info(p.parent) for p in copy.rglob("trial.json")]
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(copy, ignore_errors=True)

    def call(self, argv: list[str]) -> int:
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()) as err:
            status = relif_main(argv)
        self.calls.append((argv[0], status, err.getvalue()))
        return status


def test_a_sweep_survives_a_killed_worker_a_full_disk_and_stop_signals_while_it_is_read(
    ray_session, small_data, sweep_folder
):
    """Run 1: seed 0's worker is SIGKILLed after a checkpoint (a retry from it), then its retry's
    worker gets a file-size limit (a full disk: the next checkpoint fails, the trial's second
    failure ends it with one line naming the file); seed 1 runs, and SIGTERM stops the sweep
    gracefully. Run 2, the same command: SIGTERM and SIGUSR1 at once, the hard stop. Run 3,
    the same command: every trial completes with the uninterrupted numbers. Meanwhile reports
    and exports never fail, read finished trials only and name the running ones."""
    address = ray_session.get_runtime_context().gcs_address
    argv = sweep_argv(small_data, str(sweep_folder), address)
    command = shlex.join(argv)
    experiment = sweep_folder / "survives"
    reader = Reader(experiment, sweep_folder / "reads")

    first = Driver(argv, sweep_folder / "run1.log")
    try:
        killed = wait_for(lambda: running_with_checkpoint(experiment, 0), first.process, "seed 0")
        reader.start()
        os.kill(killed, signal.SIGKILL)  # the kernel's out-of-memory kill
        retry = wait_for(
            lambda: running_with_checkpoint(experiment, 0, not_pid=killed), first.process, "retry"
        )
        resource.prlimit(retry, resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, resource.RLIM_INFINITY))
        wait_for(lambda: status_of(experiment, 0) == "ERROR", first.process, "the full disk")
        with suppress(ProcessLookupError):  # space is back for whatever comes next
            resource.prlimit(retry, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        wait_for(lambda: running_with_checkpoint(experiment, 1), first.process, "seed 1")
        first.process.send_signal(signal.SIGTERM)
        assert first.wait() == EXIT_STOPPED
    finally:
        first.wait()
    assert first.stopped_line() == (
        "sweep stopped by SIGTERM: Ray Tune saved its state, and each running trial keeps its "
        f"last checkpoint; resume with: {sys.executable} sweeps/nyuv2.py {command}"
    )
    trial_dir = next(experiment.glob("erm_seed0_*"))
    errors = (trial_dir / "error.txt").read_text()
    first_failure = errors.split("Failure # 2")[0]  # a retry of a dead worker, not a user error
    assert "Failure # 1" in first_failure and "its worker process has died" in first_failure
    out_of_space = re.compile(  # the write on the worker's node, or the copy into storage
        r"relif_ray\.experiment\.storage\.OutOfSpace: \[Errno 27\] File too large: "
        rf"'(/\S+/relif-checkpoint-\w+/state\.pt|{trial_dir}/checkpoint_\d+)'$"
    )
    assert out_of_space.match(errors.strip().splitlines()[-1]), errors[-500:]
    for state_file in trial_dir.glob(f"checkpoint_*/{STATE_FILE}"):  # whole, every one
        assert readable_state(state_file) is not None
    problems = analysis.load(experiment).problems.set_index("path")["status"].to_dict()
    seed1_dir = next(experiment.glob("erm_seed1_*"))
    assert problems == {str(trial_dir): "errored", str(seed1_dir): "incomplete"}

    second = Driver(argv, sweep_folder / "run2.log")
    try:
        status_table = second.log.with_suffix(".out")
        wait_for(lambda: "== Status ==" in status_table.read_text(), second.process, "Tune")
        second.process.send_signal(signal.SIGTERM)
        second.process.send_signal(signal.SIGUSR1)
    finally:
        assert second.wait() == EXIT_STOPPED
    stopped = second.stopped_line()
    signals = r"(SIGTERM, then SIGUSR1|SIGUSR1, then SIGTERM)"
    hard = rf"sweep stopped at once by a second signal \({signals}\): the state Ray Tune saved "
    assert re.match(hard + "last is kept; resume with: ", stopped), stopped

    third = Driver(argv, sweep_folder / "run3.log")
    assert third.wait() == 0, third.log.read_text()[-3000:]
    reader.done.set()
    reader.join()
    assert (
        "--resume-if-present: continuing the sweep survives"
        in third.log.with_suffix(".out").read_text()
    )
    loaded = assert_uninterrupted_numbers(experiment, trained_here(argv, small_data))
    info = {read_trial_info(p)["seed"]: read_trial_info(p) for p in loaded.outputs.values()}
    assert info[0]["restored_from_checkpoint"] and info[1]["restored_from_checkpoint"]
    # Never started over: only the first worker trained from scratch, each retry continued a
    # checkpoint. Read from each result's own counters, not from which records result.json
    # holds: when Tune restarts a trial it copies back the copy of result.json that it last
    # synced into storage (`JsonLoggerCallback.log_trial_start`), which can lack the records
    # written since, the first one included.
    records = [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines()]
    from_scratch = [r for r in records if r["iterations_since_restore"] == r["training_iteration"]]
    assert records and {r["pid"] for r in from_scratch} <= {killed}, records

    assert reader.error is None and reader.calls
    assert all(status == 0 for _, status, _ in reader.calls), reader.calls  # never failed
    notes = [err for _, _, err in reader.calls if err]
    running = re.compile(
        r"relif: note: A sweep is still running: \d trial\(s\) still running \(([^)]*)\), not "
        r"(in this report; it covers the \d finished trial\(s\)|exported)"
    )
    for err in notes:  # one line, naming trial folders of the sweep
        (line,) = err.strip().splitlines()
        named = running.fullmatch(line)
        assert named, line
        assert all((experiment / name).is_dir() for name in named.group(1).split(", "))
    assert notes, "no read named a running trial"
    final = loaded.trials.set_index("trial")
    for rows in reader.rows:  # read while running: finished trials only, with their final numbers
        for row in rows.itertuples():
            for column in COMPARED:
                assert getattr(row, column) == final.loc[row.trial, f"test_{column}"]
    for copied in reader.exported:
        assert copied["metrics"] == read_trial_info(loaded.outputs[copied["trial_id"]])["metrics"]


@pytest.fixture
def store(monkeypatch) -> Iterator[dict]:
    """An S3 store (moto) on 127.0.0.1 that the test can stop and start again on its port;
    the storage URI names it and its (test) credentials, which the driver takes into its own
    environment; the trial workers of the session's Ray use their own (tests/conftest.py)."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    servers = [ThreadedMotoServer(ip_address=LOCALHOST, port=port, verbose=False)]
    servers[0].start()
    client = pafs.S3FileSystem(
        endpoint_override=f"{LOCALHOST}:{port}", scheme="http", region="us-east-1",
        access_key="testing", secret_key="testing", allow_bucket_creation=True,
    )  # fmt: skip
    client.create_dir(OUTAGE_BUCKET)
    for name in storage.CREDENTIAL_VARIABLES:  # where the URI's go in this process, put back after
        monkeypatch.delenv(name, raising=False)

    def stop() -> None:
        servers[-1].stop()

    def start() -> None:
        servers.append(ThreadedMotoServer(ip_address=LOCALHOST, port=port, verbose=False))
        servers[-1].start()

    options = f"endpoint_override={LOCALHOST}:{port}&scheme=http&region=us-east-1"
    yield {
        "uri": f"s3://testing:testing@{OUTAGE_BUCKET}/runs?{options}",
        "client": client,
        "stop": stop,
        "start": start,
    }
    servers[-1].stop()
    storage._bucket_filesystem.cache_clear()


def test_a_storage_outage_stops_the_sweep_resumably_and_resume_loses_nothing(
    ray_session, small_data, store, tmp_path
):
    """The store of an s3:// sweep goes down after a trial's first checkpoint and stays down
    longer than a checkpoint interval: the next checkpoint's copy fails and, with no retry
    left, ends the trial; the sweep ends with the store's error and the command that retries
    it (the store is back by then). That command continues the trial from its last checkpoint
    in the store: the uninterrupted numbers, every epoch in its records."""
    address = ray_session.get_runtime_context().gcs_address
    argv = sweep_argv(
        small_data, store["uri"], address, name="outage", seeds=1, epochs=3, max_failures=0
    )
    client, trials = store["client"], f"{OUTAGE_BUCKET}/runs/outage"

    def checkpointed() -> bool:
        selector = pafs.FileSelector(trials, recursive=True, allow_not_found=True)
        infos = client.get_file_info(selector)
        return any(info.path.endswith(f"checkpoint_000000/{STATE_FILE}") for info in infos)

    env = {**driver_env(), "TUNE_GLOBAL_CHECKPOINT_S": "10"}  # Tune's snapshots as in a sweep
    first = Driver(argv, tmp_path / "run1.log", env)
    try:
        wait_for(checkpointed, first.process, "a checkpoint in the store")
        store["stop"]()
        failed = "Trial task failed for trial erm_seed0"
        wait_for(lambda: failed in first.log.read_text(), first.process, "the failed copy")
    finally:
        store["start"]()
    assert first.wait() == 1, first.log.read_text()[-3000:]
    log = first.log.read_text()
    summary = log[log.index("1 trial(s) errored in s3://relif-outage/runs/outage:") :].splitlines()
    assert re.match(r"  erm seed 0: OSError: .*Could not connect to server", summary[1]), summary
    retry = "retry the errored trials (after fixing the cause) with: "
    shown = [storage.redacted(word) for word in argv]  # URI credentials are never shown
    assert summary[2] == retry + shlex.join([sys.executable, "sweeps/nyuv2.py", *shown])
    assert "testing:testing" not in log

    second = Driver(argv, tmp_path / "run2.log", env)
    assert second.wait() == 0, second.log.read_text()[-3000:]
    copy = tmp_path / "copy"
    assert relif_main(["export", store["uri"].replace("/runs?", "/runs/outage?"), str(copy)]) == 0
    loaded = assert_uninterrupted_numbers(copy, trained_here(argv, small_data))
    (outputs,) = loaded.outputs.values()
    assert read_trial_info(outputs)["restored_from_checkpoint"]
    epochs = loaded.epochs["training_iteration"].tolist()
    assert sorted(set(epochs)) == [1, 2, 3]  # every epoch in the records
