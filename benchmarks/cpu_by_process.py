"""Where a command's CPU time goes, by kind of process (Linux; reads /proc).

    python -m benchmarks.cpu_by_process -- .venv/bin/python -m pytest -q

Samples every process every `--interval` seconds; one started after the command is charged to a
kind read from its command line (Ray's trial and idle workers, its services, our drivers, pytest
and its workers, other) with its user + system time at its last sample: a lower bound, to
compare kinds, not to add up to the second. Ray renames a worker that takes an actor, so a
worker counts under the last name it had.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
RAY_SERVICES = ("gcs_server", "raylet", "dashboard", "monitor", "Agent", "log_monitor")
DRIVERS = ("sweeps/", "benchmarks.", "relif_ray.cli", "bin/relif")
"""A driver is a Python process whose script or module (`-m`) names one of these."""


@dataclass
class ProcessSample:
    started: int  # Start time in clock ticks since boot: with the pid, it names one process.
    cpu_ticks: int
    command: str


def process_kind(command: str) -> str:
    """The row a process is charged to, from its command line."""
    if any(service in command for service in RAY_SERVICES):
        return "Ray services"
    if command.startswith("ray::IDLE") or "default_worker.py" in command:
        return "Ray worker without an actor"
    if command.startswith("ray::"):
        return "Ray worker with an actor (trials)"
    program = [word for word in command.split()[1:3] if word not in ("-m", "-u")][:1]
    if program == ["pytest"] or "import sys;exec(eval(sys.stdin" in command:  # xdist workers
        return "pytest and its workers"
    for marker in DRIVERS:
        if program and marker in program[0]:
            return f"driver {Path(program[0]).name}"
    return "other"


def read_process(pid: str) -> ProcessSample | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the name, which may hold spaces
    return ProcessSample(int(fields[19]), int(fields[11]) + int(fields[12]), command)


def snapshot() -> dict[tuple[str, int], ProcessSample]:
    samples = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and (sample := read_process(pid)) is not None:
            samples[(pid, sample.started)] = sample
    return samples


def machine_busy_ticks() -> int:
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # all but idle and iowait


def measure(command: list[str], interval: float) -> tuple[dict[str, list[float]], float, float]:
    """(kind -> [processes, CPU seconds], wall seconds, machine busy CPU seconds) of `command`."""
    before = set(snapshot())
    busy, start = machine_busy_ticks(), time.monotonic()
    process = subprocess.Popen(command)
    last: dict[tuple[str, int], ProcessSample] = {}
    while process.poll() is None:
        for key, sample in snapshot().items():
            if key in before:
                continue
            if not sample.command and key in last:  # an exiting process has no command line
                sample.command = last[key].command
            last[key] = sample
        time.sleep(interval)
    wall = time.monotonic() - start
    busy = (machine_busy_ticks() - busy) / TICKS_PER_SECOND
    kinds: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for sample in last.values():
        row = kinds[process_kind(sample.command or "(no command line)")]
        row[0] += 1
        row[1] += sample.cpu_ticks / TICKS_PER_SECOND
    return dict(kinds), wall, busy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    kinds, wall, busy = measure(command, args.interval)
    print(f"wall {wall:.1f} s, machine busy {busy:.1f} CPU s ({os.cpu_count()} CPUs)")
    print(f"{'processes':>9} {'CPU s':>8}  kind")
    for kind, (count, cpu) in sorted(kinds.items(), key=lambda item: -item[1][1]):
        print(f"{count:9d} {cpu:8.1f}  {kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
