"""What every suite shares: the row, the context a suite is given (its size, `toy` for the dry
run and the tests, `demo` for the CPU's `--quick`, `real` for the full run, the paper's NYUv2
size on CUDA; its device; its deadline), the interleaved timer, the machine record and the one
JSON (and Markdown) record of a run. A suite is `suite(ctx) -> None`: it adds its rows to the
context as they come, so that a suite killed at its deadline keeps those it wrote.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import json
import math
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import torch

from benchmarks.targets import TARGETS

REPO = Path(__file__).resolve().parents[1]
SIZES = ("toy", "demo", "real")
NEEDS_GPU = "needs a GPU"
NEEDS_CUDA = "skipped: needs CUDA (toy size on a CPU)"
OUT_OF_TIME = "skipped: time budget"


@dataclass
class Row:
    """One figure: its value and unit, its target and result (pass / FAIL / within noise: a
    ratio past its target whose ~95% interval still holds it / info: no target)."""

    name: str
    value: float | None
    unit: str = ""
    target: str = "-"
    result: str = "info"
    detail: str = ""
    group: str = ""  # the suite that wrote it
    per_seed: dict[int, float] | None = None  # seed -> value, for rows that aggregate seeds


@dataclass
class Context:
    """What a suite is given: its size and device, a work folder, a deadline, where its rows go."""

    size: str
    device: torch.device
    workdir: Path
    deadline: float = math.inf  # time.time() by which the suite must be done
    rows_file: Path | None = None  # rows are appended here as they come (the check's suites)
    out: Path | None = None  # where a suite keeps files for the record (the fidelity reports)
    group: str = ""
    earlier: list[Row] = field(default_factory=list)  # earlier suites' rows: a suite may use them
    rows: list[Row] = field(default_factory=list)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def toy(self) -> bool:
        return self.size == "toy"

    @property
    def gpu_rows(self) -> bool:
        """Whether the GPU rows run: on CUDA, or at toy size on the CPU (the check's dry run)."""
        return self.cuda or self.toy

    def left(self) -> float:
        return self.deadline - time.time()

    def has_time(self, seconds: float) -> bool:
        """Whether `seconds` (what the next part takes on an H100, whatever the budget; at toy
        size, true while any time is left) still fit before the deadline."""
        return self.left() > (0.0 if self.toy else seconds)

    def earlier_row(self, name: str) -> Row | None:
        """The last row of this name with a value that this run wrote so far."""
        found = [r for r in [*self.earlier, *self.rows] if r.name == name and r.value is not None]
        return found[-1] if found else None

    def add(self, *rows: Row) -> None:
        for row in rows:
            row.group = row.group or self.group
            self.rows.append(row)
            if self.rows_file is not None:
                with self.rows_file.open("a") as file:
                    file.write(json.dumps(dataclasses.asdict(row)) + "\n")
                print(f"row: {row.name}: {row.value} {row.unit} [{row.result}] {row.detail}")
        sys.stdout.flush()

    def row(self, name: str, value: float | None, unit: str = "", detail: str = "", *,
            target: str = "-", result: str = "info") -> None:  # fmt: skip
        self.add(Row(name, value, unit, target, result, detail))

    def judged(self, target: str, name: str, value: float, unit: str = "", detail: str = "",
               interval: tuple | None = None, reference: float | None = None) -> None:  # fmt: skip
        """A row judged by `targets.TARGETS[target]` (`Target.judge`)."""
        bound = TARGETS[target]
        result = bound.judge(value, interval, reference)
        self.row(name, value, unit, detail, target=bound.text, result=result)

    def skip(self, what: str, why: str) -> None:
        self.row(what, None, result=why)

    def run(self, command: list[str]) -> int:
        """Run `command` in the repository root, killed at the deadline; its exit status (-9
        when killed). At toy size Ray is given one logical GPU, so GPU flags run unchanged."""
        print(f"$ {' '.join(command)}", flush=True)
        environment = dict(os.environ)
        if self.toy:
            environment.setdefault("RAY_OVERRIDE_RESOURCES", json.dumps({"GPU": 1}))
        process = subprocess.Popen(command, cwd=REPO, env=environment, preexec_fn=die_with_parent)
        try:
            return process.wait(timeout=max(1.0, min(self.left(), 10**7)))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            print(f"killed at the deadline: {command[1]}", flush=True)
            return -9

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        """One part of a suite: an exception in it becomes a FAIL row naming the part and the
        error's last line (the traceback goes to stderr), and the suite goes on."""
        try:
            yield
        except Exception as exc:
            traceback.print_exc()
            lines = [line for line in str(exc).splitlines() if line.strip()] or [""]
            self.row(what, None, detail=f"{type(exc).__name__}: {lines[-1][:400]}", result="FAIL")


class NotOnTheGpu(RuntimeError):
    """A GPU row whose trials trained on another device: an error, not a figure."""


def trained_on(ctx: Context, devices: Iterable[str], what: str) -> str:
    """The devices a row's trials trained on, as each trial reported it (its result or record,
    not its config), for the row's detail. A GPU row (a suite on CUDA) whose trials trained
    anywhere but on CUDA raises `NotOnTheGpu` (in `Context.step`: a FAIL row naming them)."""
    found = sorted(set(devices))
    if ctx.cuda and (not found or any(not device.startswith("cuda") for device in found)):
        raise NotOnTheGpu(f"{what}: its trials trained on {', '.join(found) or 'no device'}, "
                          "not on the GPU: not a GPU figure")  # fmt: skip
    return "trained on " + ", ".join(found)


def die_with_parent() -> None:
    """Before exec in a child: SIGKILL when its parent dies (Linux PR_SET_PDEATHSIG). A sweep
    driver moves itself into a process group of its own when it starts Ray, so a killed suite's
    process group would not include it; this way it (and, through Ray's fate sharing, its Ray
    processes) cannot outlive the suite."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


# --- the interleaved timer -------------------------------------------------------------------


def interleaved_times(
    steps: dict[str, Callable[[], None]], rounds: int, warmup: int, cuda: bool
) -> dict[str, list[float]]:
    """Per variant, its step times (s). Machines are noisy, so variants are never timed one
    after the other: each round runs one step of each in a freshly shuffled order; `warmup`
    untimed rounds first."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    shuffler = random.Random(0)
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    for round_index in range(warmup + rounds):
        order = list(steps)
        shuffler.shuffle(order)
        for name in order:
            synchronize()
            start = time.perf_counter()
            steps[name]()
            synchronize()
            if round_index >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def ratio_with_interval(
    times: dict[str, list[float]], name: str, reference: str
) -> tuple[float, float, float]:
    """Median of the per-round ratios name / reference and its ~95% interval: the order
    statistics n/2 -+ 0.98 sqrt(n) of the sorted ratios (the sign test's interval)."""
    ratios = sorted(a / b for a, b in zip(times[name], times[reference], strict=True))
    n = len(ratios)
    k = max(0, math.floor(n / 2 - 0.98 * math.sqrt(n)))
    return statistics.median(ratios), ratios[k], ratios[n - 1 - k]


def verdict(passed: bool) -> str:
    return "pass" if passed else "FAIL"


# --- the machine ------------------------------------------------------------------------------

ISA_FLAGS = re.compile(r"^(avx\w*|amx\w*|sse4\w*|fma|f16c)$")
"""The CPU flags that choose torch's kernels (and so the figures): vector and matrix units."""


def machine(cuda: bool) -> dict[str, object]:
    """Where the figures come from, without creating a CUDA context in this process (the GPU
    stays free for the suites): the GPU's name and driver from nvidia-smi."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    value = {ln.split(":")[0].strip(): ln.split(":", 1)[1].strip() for ln in lines if ":" in ln}
    flags = sorted(flag for flag in value.get("flags", "").split() if ISA_FLAGS.match(flag))
    head, dirty = _output("git", "-C", str(REPO), "rev-parse", "--short", "HEAD"), _output(
        "git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no")  # fmt: skip
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": value.get("model name") or platform.machine(), "cpu_flags": " ".join(flags),
        "cores": os.cpu_count(), "load_average": round(os.getloadavg()[0], 2), "gpu": None,
        "torch": torch.__version__, "cuda": torch.version.cuda, "ray": _version("ray"),
        "python": platform.python_version(), "torch_threads": torch.get_num_threads(),
        "commit": head and head + ("+" if dirty else ""),
    }  # fmt: skip
    query = "--query-gpu=name,driver_version,memory.total"
    gpu = _output("nvidia-smi", query, "--format=csv,noheader") if cuda else None
    if gpu:
        name, driver, memory = (part.strip() for part in gpu.splitlines()[0].split(","))
        info.update(gpu=name, driver=driver, memory=memory, cudnn=torch.backends.cudnn.version())
    return info


def _version(package: str) -> str | None:
    with contextlib.suppress(metadata.PackageNotFoundError):
        return metadata.version(package)
    return None


def _output(*command: str) -> str | None:
    """What `command` prints, stripped; None when it cannot run or fails."""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()
    return None


# --- the record of a run ----------------------------------------------------------------------


class Record:
    """A run's one JSON record (and its Markdown), rewritten whole after every suite when it
    has a folder, so that a run killed from outside still returns what it measured."""

    def __init__(self, command: str, size: str, device: str, out: Path | None = None,
                 name: str = "benchmarks", **extra: object) -> None:  # fmt: skip
        self.out, self.name = out, name
        self.payload = {"command": command, "size": size, "device": device, **extra}
        self.payload.update(machine=machine(device == "cuda"), sections=[], rows=[])
        self.write()

    def add(self, section: str, title: str, status: str, seconds: float, rows: list[dict]) -> None:
        entry = {"name": section, "title": title, "status": status, "seconds": round(seconds, 1)}
        self.payload["sections"].append(entry)
        self.payload["rows"] += rows
        self.write()

    def finish(self) -> None:
        self.payload["machine"]["load_average_end"] = round(os.getloadavg()[0], 2)
        self.write()

    def write(self) -> None:
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.payload, indent=1, allow_nan=True) + "\n"
        (self.out / f"{self.name}.json").write_text(text)
        (self.out / f"{self.name}.md").write_text(markdown(self.payload))


def caption(payload: dict) -> str:
    """The record's command, date, machine, software, commit and load, in one line."""
    info = payload["machine"]
    gpu = f"{info['gpu']} (driver {info.get('driver')})" if info.get("gpu") else "no GPU"
    flags = f", {info['cpu_flags']}" if info.get("cpu_flags") else ""
    load = "load average not recorded"
    if info.get("load_average") is not None:
        load = f"load average {info['load_average']}"
        load += f" to {info['load_average_end']}" if info.get("load_average_end") else ""
    note = f"; {payload['transcribed']}" if payload.get("transcribed") else ""
    return (
        f"`{payload['command']}`, {str(info['date'])[:10]}, {info['cpu']} ({info['cores']} cores"
        f"{flags}), {gpu}; torch {info['torch']}, Ray {info.get('ray') or '-'}, Python "
        f"{info['python']}; commit {info.get('commit') or '-'}; {load}{note}"
    )


def markdown(payload: dict, groups: tuple[str, ...] | None = None) -> str:
    """The record as Markdown: its caption, its suites (all rows) or the rows of `groups`."""
    lines = [caption(payload), ""]
    if payload.get("sections") and groups is None:
        lines += ["| suite | status | seconds |", "|---|---|---|"]
        lines += [f"| {s['name']} | {s['status']} | {s['seconds']} |" for s in payload["sections"]]
        lines.append("")
    lines += ["| row | value | target | result | detail |", "|---|---|---|---|---|"]
    for row in payload["rows"]:
        if groups is None or row.get("group") in groups:
            cells = (row["name"], format_value(row["value"], row["unit"]), row["target"],
                     row["result"], row["detail"])  # fmt: skip
            lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.3f}x"
    if unit == "pairs/s":
        return f"{value:.3g} {unit}"
    number = f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{number} {unit}".strip()
