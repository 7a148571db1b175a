"""One sweep at a time per experiment directory: an OS lock on `<experiment>/.relif-sweep.lock`.

A sweep driver (a new sweep, `--demo` or `--resume`) holds an exclusive `flock` on this file
for as long as it runs; a second driver with the same `--storage` and `--name` cannot take it
and stops with one line naming the holder. The operating system releases the lock when the
holding process ends for any reason (exit, crash, SIGKILL, a lost SSH session), so a killed
driver never leaves a stale lock behind and `--resume` can follow at once. On NFS, Linux
passes flock to the server's lock manager (not with the mount option local_lock=flock/all),
and the server frees the lock of a client machine that died when its lease runs out (about
90 s for NFSv4). The file's content (host, pid, start time) only names the holder in
messages; a lock file whose holder is gone is simply taken over. A `file://` storage is the
local directory it names (`relif_ray.experiment.storage.local_path`) and is locked the same
way. Object stores (s3://, gs://) have no locks: sweeps there are not protected and must use
distinct names.

`relif report` and `relif export` ask the same lock whether a sweep is still writing the
experiment (`running_sweep`), and then read the finished trials only and name the others as
running (`still_running`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from relif_ray.errors import UserError
from relif_ray.experiment.layout import LOCK_FILE
from relif_ray.experiment.storage import Location, local_path


@dataclass(frozen=True)
class LockHolder:
    """The sweep driver that holds an experiment's lock."""

    host: str
    pid: int
    started: str

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host}, started {self.started}"


@contextmanager
def exclusive_experiment(storage: Location, name: str) -> Iterator[None]:
    """Hold the lock of `<storage>/<name>` while the block runs (a no-op on object storage).

    Raises a one-line UserError when another process holds it. The experiment directory is
    created if needed; on leaving, the lock file is removed, and so is the directory if the
    block left nothing else in it (a sweep stopped before its first trial leaves no trace).
    """
    root = local_path(storage)
    if root is None:
        yield
        return
    experiment = root / name
    descriptor = _acquire(experiment / LOCK_FILE)
    try:
        yield
    finally:
        (experiment / LOCK_FILE).unlink(missing_ok=True)
        os.close(descriptor)
        with contextlib.suppress(OSError):  # not empty (or another sweep just started there)
            experiment.rmdir()


def prepare_new_experiment(storage: Location, name: str, replace: bool) -> None:
    """Refuse to mix a new sweep into an existing experiment; with `replace` (`--demo`) empty
    it instead, keeping the lock file that the caller holds. Call inside
    `exclusive_experiment`, so nothing that another sweep is writing is ever deleted."""
    root = local_path(storage)
    path = root / name if root is not None else None
    if path is None or not path.exists():
        return
    contents = [entry for entry in path.iterdir() if entry.name != LOCK_FILE]
    if contents and not replace:
        raise UserError(
            f"--name: experiment {path} already exists (use --resume to continue it, "
            "or another --name)"
        )
    for entry in contents:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _acquire(path: Path) -> int:
    """An open descriptor of `path` with an exclusive flock, holder details written into it.

    Retries when the file (or its directory) was removed or replaced between opening and
    locking (its previous holder was just leaving), so the lock held is always the one on the
    file at `path`.
    """
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the directory was removed by a sweep that just ended
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            holder = read_holder(path)
            raise UserError(
                f"--name: experiment {path.parent} is in use by a running sweep "
                f"({holder or 'holder unknown'}); wait for it to end or use another --name"
            ) from None
        try:
            same_file = os.stat(path).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            same_file = False
        if same_file:
            break
        os.close(descriptor)
    record = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    os.ftruncate(descriptor, 0)
    os.write(descriptor, json.dumps(record).encode())
    return descriptor


def read_holder(path: Path) -> LockHolder | None:
    """The holder recorded in a lock file (None if it is missing or not yet written)."""
    try:
        record = json.loads(Path(path).read_text())
        return LockHolder(str(record["host"]), int(record["pid"]), str(record["started"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def running_sweep(experiment: str | Path) -> LockHolder | None:
    """The sweep driver still writing `experiment`, or None when no process holds its lock
    (finished, killed, never locked, or on object storage). A holder that has not yet
    recorded itself is reported as pid 0 on an unknown host."""
    root = local_path(experiment)
    if root is None:
        return None
    path = root / LOCK_FILE
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_holder(path) or LockHolder("unknown host", 0, "unknown")
    finally:
        os.close(descriptor)
    return None


def still_running(folders: list[str]) -> str:
    """The trials of a running sweep that a reader left out, named in one line."""
    return f"{len(folders)} trial(s) still running ({', '.join(folders)})"
