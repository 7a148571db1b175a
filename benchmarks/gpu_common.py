"""What every section of the GPU check (`gpu_check.py`) shares: the sizes of a run (`Size`: the
GPU's, or a dry run's toy sizes), a `Section` of the table, the `Check` a section process is
given (its deadline, where its rows go, `step` and `skip`), commands run under the deadline,
the rows written so far (`earlier_row`), the drift between two trees of numbers, and the
`sweeps/nyuv2.py` command of the sweeps on the check's data."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from rows import Context, Row

REPO = Path(__file__).resolve().parents[1]
BATCH_SIZE = 8
"""The batch size of every sweep of the check (the paper's NYUv2 batch)."""
JSON_FILE, MARKDOWN_FILE, LOG_FILE = "gpu_check.json", "gpu_check.md", "gpu_check.log"
NEEDS_CUDA = "skipped: needs CUDA (dry run)"
OUT_OF_TIME = "skipped: time budget"


@dataclass(frozen=True)
class Size:
    """Sizes of one kind of run: on the GPU, or toy sizes for a dry run on the CPU (the data
    are `REAL_DATA` or `TOY_DATA`, the trial workers' `workers.data_root`)."""

    backbone: str
    packing_epochs: int
    """Epochs of each trial of the packing sweeps: real-size epochs of 99 steps."""
    repeat_steps: int
    method_rounds: int
    cosine_steps: int


GPU = Size("resnet50", 2, 20, 20, 10)
TOY = Size("resnet18", 1, 3, 2, 3)


@dataclass
class Section:
    """One entry of `gpu_check.SECTIONS`: a section's name (for `--only`), its title, the
    function its process runs and its time."""

    name: str
    title: str
    run: Callable[[Check], None]
    cap_s: float
    """The most this section may take of a 540 s budget (see `gpu_check.cap_scale`)."""
    min_s: float
    """It is skipped when less than this is left: seconds on the H100, whatever the budget."""


@dataclass
class Check:
    """What a section process knows: where to write, its deadline, dry run or not."""

    out: Path
    workdir: Path
    dry_run: bool
    deadline: float
    """time.time() by which the section must be done."""
    rows_file: Path
    group: str = ""

    @property
    def size(self) -> Size:
        return TOY if self.dry_run else GPU

    @property
    def device(self) -> torch.device:
        return torch.device("cpu" if self.dry_run else "cuda")

    def context(self, **fields: object) -> Context:
        """The benchmark suite's context for the GPU rows (toy sizes in a dry run)."""
        return Context(
            quick=self.dry_run,
            device=self.device,
            workdir=self.workdir,
            dry_run=self.dry_run,
            **fields,
        )

    def left(self) -> float:
        return self.deadline - time.time()

    def has_time(self, seconds: float) -> bool:
        """Whether `seconds` (what the next step takes on the H100, whatever the budget; in a
        dry run's toy sizes, true while any time is left) still fit before the deadline."""
        return self.left() > (0.0 if self.dry_run else seconds)

    def add(self, *rows: Row) -> None:
        with self.rows_file.open("a") as file:
            for row in rows:
                file.write(json.dumps(dataclasses.asdict(row)) + "\n")
                print(f"row: {row.name}: {row.value} {row.unit} [{row.result}] {row.detail}")
        sys.stdout.flush()

    def row(
        self,
        name: str,
        value: float | None,
        unit: str,
        detail: str,
        target: str = "-",
        result: str = "info",
    ) -> None:
        self.add(Row(self.group, name, value, unit, target, result, detail))

    def skip(self, what: str, why: str) -> None:
        self.row(what, None, "", "", result=why)

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        """One part of a section: an exception in it becomes a FAIL row naming the part and
        the error's last line (the traceback goes to the log), and the section goes on."""
        try:
            yield
        except Exception as exc:
            traceback.print_exc()
            lines = [line for line in str(exc).splitlines() if line.strip()] or [""]
            self.row(what, None, "", f"{type(exc).__name__}: {lines[-1][:400]}", result="FAIL")


def die_with_parent() -> None:
    """Before exec in a child: SIGKILL when its parent dies (Linux PR_SET_PDEATHSIG). A sweep
    driver moves itself into a process group of its own when it starts Ray, so a killed
    section's process group would not include it; this way it (and, through Ray's own fate
    sharing, its Ray processes) cannot outlive the section."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def run_command(check: Check, command: list[str], env: dict[str, str] | None = None) -> int:
    """Run `command` in the repository root, its output into the log; killed at the section's
    deadline. Its exit status (-9 when killed)."""
    print(f"$ {' '.join(command)}", flush=True)
    environment = {**os.environ, **(env or {})}
    if check.dry_run:
        environment.setdefault("RAY_OVERRIDE_RESOURCES", json.dumps({"GPU": 1}))
    process = subprocess.Popen(command, cwd=REPO, env=environment, preexec_fn=die_with_parent)
    try:
        return process.wait(timeout=max(1.0, check.left()))
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        print(f"killed at the section's deadline: {command[1]}", flush=True)
        return -9


def earlier_row(check: Check, name: str) -> Row | None:
    """The last row of this name with a value that this run wrote: in this section so far or
    in an earlier one (the JSON file is rewritten after each)."""
    path = check.out / JSON_FILE
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    if check.rows_file.exists():
        rows += [json.loads(line) for line in check.rows_file.read_text().splitlines()]
    found = [row for row in rows if row["name"] == name and row["value"] is not None]
    if not found:
        return None
    fields = {field.name for field in dataclasses.fields(Row)}
    return Row(**{key: value for key, value in found[-1].items() if key in fields})


def drift(pinned: object, computed: object, path: str = "") -> Iterator[tuple[str, float, float]]:
    """(path, |computed - pinned|, that over |pinned|) of every number of two JSON trees; NaN
    against NaN is no drift, NaN against a number an infinite one; a difference in structure
    raises ValueError naming its path."""
    if isinstance(pinned, dict) and isinstance(computed, dict):
        if pinned.keys() != computed.keys():
            raise ValueError(
                f"{path or '/'}: keys {sorted(pinned.keys() ^ computed.keys())} differ"
            )
        for key in pinned:
            yield from drift(pinned[key], computed[key], f"{path}/{key}")
    elif isinstance(pinned, list) and isinstance(computed, list):
        if len(pinned) != len(computed):
            raise ValueError(f"{path}: {len(computed)} entries, {len(pinned)} pinned")
        for index, (a, b) in enumerate(zip(pinned, computed, strict=True)):
            yield from drift(a, b, f"{path}[{index}]")
    elif isinstance(pinned, int | float) and isinstance(computed, int | float):
        a, b = float(pinned), float(computed)
        if math.isnan(a) or math.isnan(b):
            yield (
                (path, 0.0, 0.0) if math.isnan(a) and math.isnan(b) else (path, math.inf, math.inf)
            )
            return
        difference = abs(b - a)
        yield path, difference, difference / abs(a) if a != 0 else difference
    elif pinned != computed:
        raise ValueError(f"{path}: {computed!r}, pinned {pinned!r}")


REAL_DATA = {"train": 795, "val": 654, "height": 288, "width": 384}
"""The paper's NYUv2 size: the data of the breakdown, the fidelity sweeps and the packing."""
TOY_DATA = {"train": 16, "val": 8, "height": 32, "width": 40}
"""What a dry run writes instead."""
REAL_DATA_PID = "real-data.pid"
"""In the work folder while `relif make-data` writes the real-size data in the background."""


def real_data_root(workdir: Path, dry_run: bool) -> Path:
    sizes = TOY_DATA if dry_run else REAL_DATA
    return workdir / f"data-{sizes['train']}-{sizes['val']}-{sizes['height']}x{sizes['width']}"


def make_data_command(root: Path, sizes: dict[str, int]) -> list[str]:
    command = [sys.executable, "-m", "relif_ray.cli", "make-data", "nyuv2", "--out", str(root)]
    for name, value in sizes.items():
        command += [f"--{name}", str(value)]
    return command + ["--seed", "0"]


def start_real_data(workdir: Path, dry_run: bool, log: object) -> subprocess.Popen | None:
    """Start writing the real-size data in the background (the CPU writes while the first
    sections use the GPU); None when it is there already. The writer renames the folder into
    place when it is complete (`relif make-data`)."""
    root = real_data_root(workdir, dry_run)
    if root.exists():
        return None
    command = make_data_command(root, TOY_DATA if dry_run else REAL_DATA)
    process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    (workdir / REAL_DATA_PID).write_text(str(process.pid))
    return process


def real_data(check: Check) -> Path:
    """The real-size data: waited for while the background writer runs, else written now."""
    root = real_data_root(check.workdir, check.dry_run)
    pid_file = check.workdir / REAL_DATA_PID
    while not root.exists() and pid_file.exists() and _alive(int(pid_file.read_text())):
        if check.left() <= 0:
            break
        time.sleep(1.0)
    if not root.exists():
        run_command(check, make_data_command(root, TOY_DATA if check.dry_run else REAL_DATA))
    return root


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (an exited one its parent has not reaped is dead)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def sweep_command(check: Check, name: str, gpus_per_trial: float, seeds: int) -> list[str]:
    """`sweeps/nyuv2.py` of ERM x `seeds` on the real-size data with the sweep's default GPU
    path: one GPU, random weights, `packing_epochs` epochs, no retries."""
    size = check.size
    command = [sys.executable, "sweeps/nyuv2.py", "--data-dir", str(real_data(check))]
    command += ["--methods", "erm", "--seeds", str(seeds)]
    command += ["--epochs", str(size.packing_epochs), "--backbone", size.backbone]
    command += ["--batch-size", str(BATCH_SIZE), "--pretrained", "none"]
    command += ["--num-gpus", "1", "--gpus-per-trial", f"{gpus_per_trial:.3f}"]
    command += ["--max-failures", "0", "--storage", str(check.workdir / "results")]
    return command + ["--name", name]


def trials_of(experiment: Path) -> list[dict]:
    """The trial.json of every finished trial of an experiment directory."""
    return [
        json.loads(p.read_text())
        for p in sorted(experiment.glob("*/checkpoint_*/outputs/trial.json"))
    ]
