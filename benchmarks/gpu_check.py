"""The prepared GPU check: every GPU figure of relif-ray in one run of at most 7 minutes.

    benchmarks/gpu_check.sh OUT                       # on the lent GPU machine (see there)
    python benchmarks/gpu_check.py --out DIR          # where Ray etc. are installed
    python benchmarks/gpu_check.py --out DIR --only compile realsize    # some sections only
    python benchmarks/gpu_check.py --dry-run --out DIR    # CPU, toy sizes (~5 min on 2 cores)

Sections, most important first; each runs in a process of its own, with a deadline (its
share of `--budget-s`, 420 s by default; a longer budget does not lengthen it, see `cap_scale`):
a section that would start with less than it needs is recorded as "skipped: time budget", one
that overruns is killed (its rows so far are kept).

1. `cuda`: the CUDA-only tests (`tests/test_fast_path.py -k cuda`) and the pinned numbers of
   `tests/test_pinned_numbers.py` recomputed with every run on CUDA: max abs/rel drift per key.
2. `resnet50`: ResNet-50 at 288x384, batch 8: training images/s, GPU utilisation while timed
   and peak GPU memory of ERM and ERM + ReLiF (bf16, channels-last, the train split on the
   GPU) and of a plain fp32 PyTorch loop of the same model (targets: ERM >= 1.5x the plain
   loop; ERM + ReLiF step time <= 1.05x ERM's). The GPU is kept busy for a few seconds first,
   and every worker trains 10 untimed steps (cuDNN autotuning) before its timed ones.
3. `methods`: the same for the paper's other methods, then the step-time ratios against ERM
   and TorchJD, then any further registered method, while the section's time lasts.
4. `sweeps`: two sweeps through the real `sweeps/nyuv2.py`, 2 ERM trials of 2 epochs each
   (`--set train.data_on_device=true`), with `--gpus-per-trial 1` and `0.5` (two trials share
   the GPU): aggregate images/s and GPU utilisation (NVML, sampled in a thread).
5. `compile`: ERM with `train.compile` on, against off.
6. `repeatability`: the same config and seed twice on one GPU (separate processes), with the
   documented cuDNN settings (`cudnn_benchmark` on, the default) and with it off: max |diff|.
7. `realsize`: synthetic NYUv2 at 288x384 (`relif make-data`), ERM, ReLiF (and `relif-st`
   where that label exists) through the real sweep and `relif report`, in bf16, then fp32: the
   report's Bias@delta_p75, VR@delta_p75 and Worst.

Everything lands in DIR: `gpu_check.json` (every row, the machine, each section's status),
`gpu_check.md` (the same as tables), `gpu_check.log` (every command's output) and the reports
`report_bf16.md`, `report_fp32.md`; the JSON and Markdown are rewritten after every section,
so a run killed from outside still returns what it measured. Nothing is downloaded (models
start from random weights). `--dry-run` runs the orchestration and every row's code on the CPU
at toy sizes with logical GPUs for Ray; what needs CUDA is recorded as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import datetime
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from memory_rows import PLAIN_LOOP, memory_and_throughput_rows, plain_loop_rows
from methods_rows import methods_rows
from relif_rows import relif_rows
from rows import Context, Row, machine
from utilisation import UtilisationSampler, warm_up_gpu
from workers import data_root, run_worker, trial_config, variants

REPO = Path(__file__).resolve().parents[1]
BATCH_SIZE = 8
"""The batch size of every sweep of the check (the paper's NYUv2 batch)."""
JSON_FILE, MARKDOWN_FILE, LOG_FILE = "gpu_check.json", "gpu_check.md", "gpu_check.log"
BUDGET_S = 420.0
"""The whole check on one GPU: 7 minutes."""
KILL_GRACE_S = 30.0
"""A section process gets this long past its deadline to end its own commands first."""
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
    name: str
    title: str
    run: Callable[[Check], None]
    cap_s: float
    """The most this section may take of a 420 s budget (see `cap_scale`)."""
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


# --- 1. CUDA-only tests and pinned numbers --------------------------------------------------


def cuda_section(check: Check) -> None:
    junit = check.workdir / "cuda_tests.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["tests/test_fast_path.py", "-k", "cuda", f"--junitxml={junit}"]
    run_command(check, command)
    check.add(*pytest_case_rows(junit))
    if not check.has_time(20):
        check.skip("pinned numbers on CUDA", OUT_OF_TIME)
        return
    with check.step("pinned numbers on CUDA"):
        pinned_rows(check)


def pytest_case_rows(junit: Path) -> list[Row]:
    """One row per test case of a pytest JUnit XML report (no report: one FAIL row)."""
    if not junit.exists():
        return [Row("cuda", "CUDA-only tests", None, "", "pass", "FAIL", "pytest wrote no report")]
    rows = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        outcome, detail = "pass", f"{case.get('time', '?')} s"
        for tag, name in (("failure", "FAIL"), ("error", "FAIL"), ("skipped", "skipped")):
            element = case.find(tag)
            if element is not None:
                outcome, detail = name, (element.get("message") or tag).splitlines()[0][:300]
                break
        rows.append(Row("cuda", f"test {case.get('name')}", None, "", "pass", outcome, detail))
    return rows


@contextlib.contextmanager
def every_run_on(device: torch.device) -> Iterator[None]:
    """Every `TrainingRun` built inside runs on `device`, whatever its config says."""
    import relif_ray.engine as engine

    original = engine.resolve_device
    engine.resolve_device = lambda name: device
    try:
        yield
    finally:
        engine.resolve_device = original


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


def pinned_rows(check: Check) -> None:
    """The pinned numbers recomputed with every run on the check's device: each key's max
    absolute and relative drift from `tests/pinned_numbers.json`."""
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))
    from tests.test_pinned_numbers import PINS, compute

    pins = json.loads(PINS.read_text())
    with every_run_on(check.device):
        computed = json.loads(json.dumps(compute(check.workdir / "pins")))
    for key in sorted(pins):
        name = f"pinned numbers drift on {check.device.type}, {key}"
        try:
            values = list(drift(pins[key], computed.get(key)))
        except ValueError as exc:
            check.row(name, None, "", str(exc), target="same structure", result="FAIL")
            continue
        where, worst, _ = max(values, key=lambda value: value[1])
        detail = f"max |diff| {worst:.3g} at {where}; {len(values)} numbers compared"
        check.row(name, max(value[2] for value in values), "rel", detail)


# --- 2. and 3. ResNet-50 throughput, memory and step-time ratios -----------------------------


def resnet50_section(check: Check) -> None:
    context = check.context()
    if not check.dry_run:
        warm_up_gpu(check.device)  # the first worker timed would meet idle clocks
    for variant in ("erm", "relif"):
        with check.step(f"training images/s, {variant}"):
            check.add(*memory_and_throughput_rows(context, (variant,), plain_loop=False))
    with check.step(f"training images/s, {PLAIN_LOOP}"):
        erm = earlier_row(check, "training images/s, erm")
        check.add(*plain_loop_rows(context, erm.value if erm else None))
    if not check.has_time(20):
        check.skip("ERM+ReLiF / ERM step time", OUT_OF_TIME)
        return
    with check.step("ERM+ReLiF / ERM step time"):
        check.add(*relif_rows(context, rounds=check.size.relif_rounds))


def methods_section(check: Check) -> None:
    """The paper's other methods, then the step-time ratios of every method to ERM and to
    TorchJD (one process for all), then the further methods' own rows while the section's time
    lasts: the ratios say more than one further method's images/s, and until run 2 they came
    last and were never reached."""
    from relif_ray.sweep.labels import PAPER_LABELS

    context = check.context()
    others = [v for v in variants() if v not in ("erm", "relif")]
    paper = [v for v in others if v in PAPER_LABELS]
    for method in paper:
        method_throughput(check, context, method)
    if not check.has_time(35):
        check.skip("method / ERM and / TorchJD step times", OUT_OF_TIME)
    else:
        with check.step("method / ERM and / TorchJD step times"):
            check.add(*methods_rows(context, check.size.method_rounds, check.size.cosine_steps))
    for method in [v for v in others if v not in paper]:
        method_throughput(check, context, method)


def method_throughput(check: Check, context: Context, method: str) -> None:
    """One method's images/s, GPU utilisation and peak memory, if 15 s are left."""
    name = f"training images/s, {method}"
    if not check.has_time(15):
        check.skip(name, OUT_OF_TIME)
        return
    with check.step(name):
        check.add(*memory_and_throughput_rows(context, (method,), plain_loop=False))


# --- 4. sweeps: packing; 5. compile ---------------------------------------------------------


def sweep_data(check: Check) -> Path:
    """Synthetic NYUv2 at the check's size, written once by `relif make-data`."""
    size = check.size
    root = check.workdir / f"sweep-data-{size.height}x{size.width}"  # not run.data_root's
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


def packing_section(check: Check) -> None:
    aggregate = {}
    for gpus_per_trial in (1.0, 0.5):
        label = f"--gpus-per-trial {gpus_per_trial:g}"
        name = f"sweep aggregate images/s, {label}"
        if not check.has_time(70):  # one sweep: 65-68 s with Ray's start and shutdown (run 2)
            check.skip(name, OUT_OF_TIME)
            continue
        with check.step(name):
            aggregate[gpus_per_trial] = sweep_throughput(check, gpus_per_trial, label)
    if aggregate.get(0.5) and aggregate.get(1.0):
        ratio = aggregate[0.5] / aggregate[1.0]
        check.row("sweep aggregate images/s, 2 trials per GPU / 1", ratio, "x", "the rows above")


def sweep_throughput(check: Check, gpus_per_trial: float, label: str) -> float | None:
    """One sweep of 2 ERM trials: its aggregate images/s over the trials' span, and the GPU's
    mean utilisation then (rows); the images/s, None if the sweep failed."""
    name = f"packing-{gpus_per_trial:g}"
    epochs = check.size.packing_epochs
    command = sweep_command(check, name, "erm", gpus_per_trial, 2, "bf16", epochs)
    sampler = None if check.dry_run else UtilisationSampler(torch.device("cuda"), 0, math.inf, 0.25)
    if sampler is not None:
        sampler.start()
    start = time.time()
    code = run_command(check, command)
    wall = time.time() - start
    if sampler is not None:
        sampler.stopped.set()
    trials = trials_of(check.workdir / "results" / name)
    if code != 0 or not trials:
        detail = f"sweeps/nyuv2.py exited {code}; {len(trials)} trial(s) finished"
        check.row(f"sweep aggregate images/s, {label}", None, "img/s", detail, result="FAIL")
        return None
    first = min(t["started_at"] for t in trials)
    last = max(t["finished_at"] for t in trials)
    images_per_s = sum(t["steps"] for t in trials) * BATCH_SIZE / (last - first)
    size = check.size
    devices = sorted({trial["device"] for trial in trials})
    on_cpu = not check.dry_run and any(not device.startswith("cuda") for device in devices)
    check.row(
        f"sweep aggregate images/s, {label}",
        images_per_s,
        "img/s",
        f"{len(trials)} ERM trials x {trials[0]['steps']} steps of batch {BATCH_SIZE} "
        f"({size.backbone} {size.height}x{size.width} bf16, channels-last, data on device; "
        f"{epochs} epochs, "
        "each with validation, live audit and checkpoint) over the trials' span "
        f"{last - first:.1f} s (set-up to outputs written); the command took {wall:.1f} s (Ray "
        f"start and shutdown included); trials ran on {', '.join(devices)}",
        target="trials on cuda",
        result="FAIL" if on_cpu else "info",
    )
    if sampler is None:
        check.skip(f"GPU utilisation, {label}", NEEDS_CUDA)
        return images_per_s
    mean = sampler.mean(first, last)
    check.row(
        f"GPU utilisation, {label}",
        mean,
        "%",
        f"NVML every 0.25 s over the trials' span; {len(sampler.samples)} samples over the "
        f"whole command, mean {sampler.mean() or 0:.0f}%",
        result="info" if mean is not None else "no reading",
    )
    return images_per_s


def compile_section(check: Check) -> None:
    """ERM with `train.compile` against the same worker without it (the resnet50 section's
    row when it ran)."""
    with check.step("training images/s, erm (compile)"):
        compile_rows(check)


def compile_rows(check: Check) -> None:
    if not check.has_time(90):
        check.skip("training images/s, erm (compile)", OUT_OF_TIME)
        return
    backend = "eager" if check.dry_run else None
    context = check.context(compile=True, compile_backend=backend)
    rows = memory_and_throughput_rows(context, ("erm",), plain_loop=False)
    check.add(*rows)
    compiled = next(r for r in rows if r.name == "training images/s, erm (compile)")
    plain = earlier_row(check, "training images/s, erm")
    if plain is None:
        rows = memory_and_throughput_rows(check.context(), ("erm",), plain_loop=False)
        check.add(*rows)
        plain = next(r for r in rows if r.name == "training images/s, erm")
    how = "dynamo with the eager backend (dry run)" if backend else "inductor, default mode"
    detail = f"{how}; the first 3 steps (compilation) are not timed"
    check.row(
        "ERM images/s with train.compile / without", compiled.value / plain.value, "x", detail
    )


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


# --- 6. repeatability -----------------------------------------------------------------------


def repeatability_section(check: Check) -> None:
    context = check.context()
    root = data_root(context, gpu=True)
    for benchmark in (True, False):
        name = f"same seed twice, cudnn_benchmark {'on (default)' if benchmark else 'off'}"
        if not check.has_time(40):  # two worker processes: 42 s on the H100 (run 2)
            check.skip(name, OUT_OF_TIME)
        elif check.dry_run and not benchmark:  # cuDNN settings change nothing on a CPU
            check.skip(name, NEEDS_CUDA)
        else:
            with check.step(name):
                repeat(check, context, root, name, benchmark)


def repeat(check: Check, context: Context, root: Path, name: str, benchmark: bool) -> None:
    """ERM + ReLiF twice from one seed, in two worker processes: max |diff| of the traces."""
    config = trial_config(context, root, "relif", gpu=True)
    config["train"]["cudnn_benchmark"] = benchmark
    steps = check.size.repeat_steps
    traces = [run_worker(config, 0, steps, trace=True)["trace"] for _ in range(2)]
    values = list(drift(traces[0], traces[1]))
    worst = max(value[1] for value in values)
    detail = (
        f"ERM + ReLiF bf16 channels-last, {steps} steps from one seed in two processes on "
        f"{check.device.type}: every step's losses, weights and ReLiF state ({len(values)} "
        "numbers)"
    )
    result = "identical" if worst == 0 else "differs"
    check.row(name, worst, "max |diff|", detail, result=result)


# --- 7. real-size synthetic NYUv2 through the sweep and the report -------------------------


def realsize_section(check: Check) -> None:
    from relif_ray.sweep.labels import RELIF_LABELS

    labels = ["erm", "relif"] + (["relif-st"] if "relif-st" in RELIF_LABELS else [])
    steps = check.size.epochs * (check.size.train // BATCH_SIZE)
    for precision in ("bf16", "fp32"):
        what = f"sweep and report of {', '.join(labels)} in {precision}"
        if not check.has_time(100):  # sweep and report: 103 s in bf16 on the H100 (run 2)
            check.skip(what, OUT_OF_TIME)
            continue
        with check.step(what):
            sweep_and_report(check, labels, precision, steps)


def sweep_and_report(check: Check, labels: list[str], precision: str, steps: int) -> None:
    """One seed of `labels` through `sweeps/nyuv2.py` (2 trials share the GPU) and `relif
    report`: the report's numbers as rows, its report.md as report_<precision>.md."""
    from relif_ray.relif.controller import scale_to_budget

    eta, warmup = scale_to_budget(steps)
    name = f"realsize-{precision}"
    extra = ("--eta", f"{eta:g}", "--warmup-steps", str(warmup))
    command = sweep_command(
        check, name, ",".join(labels), 0.5, 1, precision, check.size.epochs, extra
    )
    if run_command(check, command) != 0:
        check.row(f"sweep {precision}", None, "", "sweeps/nyuv2.py failed", result="FAIL")
        return
    report = check.workdir / f"report-{precision}"
    command = [sys.executable, "-m", "relif_ray.cli", "report"]
    command += [str(check.workdir / "results" / name), "--out", str(report)]
    if run_command(check, command) != 0:
        check.row(f"report {precision}", None, "", "relif report failed", result="FAIL")
        return
    shutil.copy(report / "report.md", check.out / f"report_{precision}.md")
    setting = f"{steps} steps, eta {eta:g}, warmup {warmup} (scale_to_budget)"
    report_rows(check, report / "per_trial.csv", precision, setting)


def report_rows(check: Check, per_trial: Path, precision: str, setting: str) -> None:
    """Bias@delta_p75, VR@delta_p75 and Worst of every trial of a report's per_trial.csv."""
    import pandas as pd

    columns = {"bias_p75": "Bias@delta_p75", "vr_p75": "VR@delta_p75", "worst": "Worst"}
    for trial in pd.read_csv(per_trial).itertuples():
        for column, title in columns.items():
            value = float(getattr(trial, column))
            detail = f"seed {trial.seed}, {precision}, {setting}; report_{precision}.md"
            check.row(f"{title}, {trial.label}, {precision}", value, "", detail)


SECTIONS = (
    Section("cuda", "CUDA-only tests and pinned numbers on CUDA", cuda_section, 90, 20),
    Section(
        "resnet50",
        "ResNet-50 288x384 batch 8: ERM, ERM+ReLiF, plain fp32 loop",
        resnet50_section,
        100,
        30,
    ),
    # Each method's worker takes ~28 s on the H100 (process, CUDA and cuDNN start, 10 + 40
    # steps; run 2): 4 paper methods and the step-time ratios before the further methods.
    Section("methods", "the other methods: images/s, memory, step time", methods_section, 150, 20),
    Section("sweeps", "real sweeps: 1 and 2 trials per GPU", packing_section, 160, 60),
    Section("compile", "ERM with train.compile against without", compile_section, 120, 90),
    Section("repeatability", "same seed twice on one GPU", repeatability_section, 90, 20),
    Section(
        "realsize",
        "288x384 synthetic NYUv2 through sweep and report, bf16 and fp32",
        realsize_section,
        240,
        60,
    ),
)


# --- running commands and sections ----------------------------------------------------------


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


def run_section(args: argparse.Namespace) -> int:
    """A section process: run one section, its rows appended to --rows as they come."""
    section = next(s for s in SECTIONS if s.name == args.section)
    torch.set_num_threads(1)  # as benchmarks/run.py: in-process timings on one host thread
    check = Check(
        out=args.out,
        workdir=args.workdir,
        dry_run=args.dry_run,
        deadline=args.deadline,
        rows_file=args.rows,
        group=section.name,
    )
    section.run(check)
    return 0


class Report:
    """The run's JSON and Markdown, rewritten whole after every section."""

    def __init__(self, out: Path, info: dict, dry_run: bool, budget: float) -> None:
        self.out, self.dry_run, self.budget = out, dry_run, budget
        self.payload = {
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": info,
            "dry_run": dry_run,
            "budget_s": budget,
            "sections": [],
            "rows": [],
        }
        self.write()  # replaces the files of an earlier run in the same folder at once

    def add(self, section: Section, status: str, seconds: float, rows: list[dict]) -> None:
        self.payload["sections"].append(
            {
                "name": section.name,
                "title": section.title,
                "status": status,
                "seconds": round(seconds, 1),
            }
        )
        self.payload["rows"] += [{"section": section.name, **row} for row in rows]
        self.write()

    def write(self) -> None:
        (self.out / JSON_FILE).write_text(json.dumps(self.payload, indent=1, allow_nan=True) + "\n")
        (self.out / MARKDOWN_FILE).write_text(self.markdown())

    def markdown(self) -> str:
        info = self.payload["machine"]
        lines = [
            f"# relif-ray GPU check{' (dry run, CPU, toy sizes)' if self.dry_run else ''}",
            "",
            f"{self.payload['started']}; GPU {info.get('gpu') or 'none'}; driver "
            f"{info.get('driver') or '-'}; torch {info['torch']} (CUDA {info.get('cuda') or '-'}, "
            f"cuDNN {info.get('cudnn') or '-'}); Python {info['python']}; {info['cpu']}, "
            f"{info['cores']} cores; budget {self.budget:.0f} s",
            "",
            "| section | status | seconds |",
            "|---|---|---|",
        ]
        lines += [
            f"| {s['name']} | {s['status']} | {s['seconds']} |" for s in self.payload["sections"]
        ]
        for section in self.payload["sections"]:
            rows = [r for r in self.payload["rows"] if r["section"] == section["name"]]
            lines += ["", f"## {section['name']}: {section['title']}", ""]
            lines += ["| row | value | target | result | detail |", "|---|---|---|---|---|"]
            lines += ["| " + " | ".join(markdown_cells(row)) + " |" for row in rows]
        return "\n".join(lines) + "\n"


def markdown_cells(row: dict) -> list[str]:
    """A row's cells for a Markdown table (a '|' inside a cell escaped)."""
    cells = [row["name"], format_value(row["value"], row["unit"]), row["target"], row["result"]]
    return [cell.replace("|", "\\|") for cell in [*cells, row["detail"]]]


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.3f}x"
    text = f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}".strip()


def machine_info(dry_run: bool) -> dict:
    """The machine, without creating a CUDA context in this process (the GPU stays free for
    the sections): the GPU's name and driver from nvidia-smi."""
    info = machine(torch.device("cpu"))
    info.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
    if not dry_run:
        query = [
            "nvidia-smi",
            "--query-gpu=name,driver_version,memory.total",
            "--format=csv,noheader",
        ]
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            fields = subprocess.run(query, capture_output=True, text=True, check=True).stdout
            name, driver, memory = (part.strip() for part in fields.splitlines()[0].split(","))
            info.update(gpu=name, driver=driver, gpu_memory=memory)
    return info


def cap_scale(budget_s: float, dry_run: bool) -> float:
    """What every section's cap is multiplied by. On a GPU the caps are sized for a 420 s
    budget on an H100: a shorter budget shrinks them in proportion, a longer one leaves them
    as they are, so the time it adds goes to the sections after one that fills its cap (the
    `methods` section takes further methods while its cap lasts) instead of to that one
    section. A dry run's toy sections on the CPU have no estimates: their caps are the same
    shares of whatever budget it has."""
    return budget_s / BUDGET_S if dry_run else min(1.0, budget_s / BUDGET_S)


def run_all(args: argparse.Namespace) -> int:
    """Every selected section in order, each in its own process, within the budget."""
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check.py: error: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
        return 2
    report = Report(out, machine_info(args.dry_run), args.dry_run, args.budget_s)
    scale = cap_scale(args.budget_s, args.dry_run)
    end = time.time() + args.budget_s
    log = (out / LOG_FILE).open("a")
    workdir = args.workdir.resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="gpu-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        for section in SECTIONS:
            if args.only and section.name not in args.only:
                continue
            start = time.time()
            if end - start <= section.min_s:
                report.add(section, OUT_OF_TIME, 0.0, [])
                continue
            deadline = start + min(section.cap_s * scale, end - start)
            status, rows = section_process(args, section, workdir, deadline, log)
            report.add(section, status, time.time() - start, rows)
            print(f"{section.name}: {status} in {time.time() - start:.0f} s", flush=True)
    finally:
        log.close()
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print_summary(report.payload)
    failed = [s for s in report.payload["sections"] if s["status"] not in ("done", OUT_OF_TIME)]
    missed = [r for r in report.payload["rows"] if r["result"] == "FAIL"] and not args.dry_run
    return 1 if failed or missed else 0


def section_process(
    args: argparse.Namespace, section: Section, workdir: Path, deadline: float, log
) -> tuple[str, list[dict]]:
    """Run one section in its own process group; (status, rows)."""
    rows_file = workdir / f"{section.name}.rows.jsonl"
    rows_file.unlink(missing_ok=True)
    command = [sys.executable, str(Path(__file__).resolve()), "--section", section.name]
    command += [
        "--out",
        str(args.out.resolve()),
        "--workdir",
        str(workdir),
        "--rows",
        str(rows_file),
    ]
    command += ["--deadline", repr(deadline)]
    command += ["--dry-run"] if args.dry_run else []
    log.write(f"\n===== section {section.name} ({section.title}) =====\n")
    log.flush()
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=environment,
    )
    try:
        code = process.wait(timeout=max(1.0, deadline - time.time() + KILL_GRACE_S))
        status = "done" if code == 0 else f"error (exit {code}; see {LOG_FILE})"
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        status = "timed out (killed at its deadline)"
    rows = (
        [json.loads(line) for line in rows_file.read_text().splitlines()]
        if rows_file.exists()
        else []
    )
    return status, rows


def print_summary(payload: dict) -> None:
    """The sections and every row with a value or a verdict, last in the output."""
    print("\n" + "=" * 30 + " gpu_check summary " + "=" * 30)
    for section in payload["sections"]:
        print(f"[{section['name']}] {section['status']} ({section['seconds']} s)")
        for row in payload["rows"]:
            if row["section"] == section["name"]:
                print(
                    f"  {row['name']}: {format_value(row['value'], row['unit'])} "
                    f"(target {row['target']}) {row['result']}"
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for the JSON, Markdown, log"
    )
    parser.add_argument("--dry-run", action="store_true", help="CPU, toy sizes, logical GPUs")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help=f"time for the whole check (default {BUDGET_S:.0f}; dry run 1800)",
    )
    parser.add_argument(
        "--only", nargs="+", choices=[s.name for s in SECTIONS], help="these sections"
    )
    # A section process (started by the check itself):
    parser.add_argument("--section", choices=[s.name for s in SECTIONS], help=argparse.SUPPRESS)
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep the data, experiments and reports here (default: a "
        "temporary folder, removed at the end)",
    )
    parser.add_argument("--rows", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.section:
        return run_section(args)
    if args.budget_s is None:
        args.budget_s = 1800.0 if args.dry_run else BUDGET_S
    return run_all(args)


if __name__ == "__main__":
    raise SystemExit(main())
