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
    """Sizes of one kind of run: on the GPU, or toy sizes for a dry run on the CPU."""

    backbone: str
    height: int
    width: int
    train: int
    val: int
    epochs: int
    """Epochs of each trial of the real-size sweeps (`realsize`)."""
    packing_epochs: int
    """Epochs of each trial of the packing sweeps (`sweeps`): fewer, so both sweeps fit."""
    repeat_steps: int
    relif_rounds: int
    method_rounds: int
    cosine_steps: int


GPU = Size("resnet50", 288, 384, 320, 32, 3, 2, 20, 40, 20, 10)
"""320 train / 32 val images at 288x384 (40 steps of batch 8 per epoch; written in about 12 s);
a packing sweep's trial trains 2 epochs (80 steps, a second or two at a few hundred
images/s, beside its set-up, validations and checkpoints), a real-size one 3 (120 steps)."""
TOY = Size("resnet18", 32, 40, 16, 8, 1, 1, 3, 2, 2, 3)


@dataclass
class Section:
    """One entry of `gpu_check.SECTIONS`: a section's name (for `--only`), its title, the
    function its process runs and its time."""

    name: str
    title: str
    run: Callable[[Check], None]
    cap_s: float
    """The most this section may take of a 420 s budget (see `gpu_check.cap_scale`)."""
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


def sweep_data(check: Check) -> Path:
    """Synthetic NYUv2 at the check's size, written once by `relif make-data`."""
    return written_data(check, check.size)


def written_data(check: Check, size: object) -> Path:
    """Synthetic NYUv2 of `size.train` / `size.val` images at `size.height` x `size.width`,
    written once per check by `relif make-data` (seed 0) and shared by its sections."""
    name = f"data-{size.train}-{size.val}-{size.height}x{size.width}"
    root = check.workdir / name  # not workers.data_root's
    if not root.exists():
        command = [sys.executable, "-m", "relif_ray.cli", "make-data", "nyuv2", "--out", str(root)]
        command += ["--train", str(size.train), "--val", str(size.val), "--seed", "0"]
        command += ["--height", str(size.height), "--width", str(size.width)]
        run_command(check, command)
    return root


def sweep_command(
    check: Check,
    name: str,
    methods: str,
    gpus_per_trial: float,
    seeds: int,
    precision: str,
    epochs: int,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """`sweeps/nyuv2.py` on the check's data: one GPU, random weights, no retries, the train
    split held on the GPU (`train.data_on_device`)."""
    size = check.size
    command = [sys.executable, "sweeps/nyuv2.py", "--data-dir", str(sweep_data(check))]
    command += ["--methods", methods, "--seeds", str(seeds), "--epochs", str(epochs)]
    command += ["--backbone", size.backbone, "--batch-size", str(BATCH_SIZE)]
    command += ["--pretrained", "none"]
    command += [
        "--precision",
        precision,
        "--channels-last" if precision == "bf16" else "--no-channels-last",
    ]
    command += ["--set", "train.data_on_device=true"]
    command += ["--num-gpus", "1", "--gpus-per-trial", f"{gpus_per_trial:g}", "--max-failures", "0"]
    command += ["--storage", str(check.workdir / "results"), "--name", name, *extra]
    return command


def trials_of(experiment: Path) -> list[dict]:
    """The trial.json of every finished trial of an experiment directory."""
    return [
        json.loads(p.read_text())
        for p in sorted(experiment.glob("*/checkpoint_*/outputs/trial.json"))
    ]
