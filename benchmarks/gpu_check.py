"""The prepared GPU check: every GPU figure of relif-ray in one run of at most 7 minutes.

    benchmarks/gpu_check.sh OUT                       # on the lent GPU machine (see there)
    python benchmarks/gpu_check.py --out DIR          # where Ray etc. are installed
    python benchmarks/gpu_check.py --out DIR --only compile realsize    # some sections only
    python benchmarks/gpu_check.py --dry-run --out DIR    # CPU, toy sizes (~5 min on 2 cores)

Sections, most important first; each runs in a process of its own, with a deadline (its
share of `--budget-s`, 420 s by default; a longer budget does not lengthen it, see `cap_scale`):
a section that would start with less than it needs is recorded as "skipped: time budget", one
that overruns is killed (its rows so far are kept).

1. `cuda`: the CUDA-only tests (`pytest -m cuda tests/`) and the pinned numbers of
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

This file is the table of sections (`SECTIONS`) and the orchestration: a process per section,
the budget, the command line. Each section is a module of its own with one function that takes
a `Check`: `gpu_cuda.py`, `gpu_resnet50.py`, `gpu_methods.py`, `gpu_sweeps.py`,
`gpu_compile.py`, `gpu_repeatability.py`, `gpu_realsize.py`; what they share (`Check`, `Size`,
commands run under the deadline) is in `gpu_common.py`, the JSON and Markdown in
`gpu_report.py`. A new section is a new module and one entry in `SECTIONS`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from gpu_breakdown import breakdown_section
from gpu_common import LOG_FILE, OUT_OF_TIME, REPO, Check, Section
from gpu_compile import compile_section
from gpu_cuda import cuda_section
from gpu_methods import methods_section
from gpu_realsize import realsize_section
from gpu_repeatability import repeatability_section
from gpu_report import Report, machine_info, print_summary
from gpu_resnet50 import resnet50_section
from gpu_sweeps import packing_section

BUDGET_S = 420.0
"""The whole check on one GPU: 7 minutes."""
KILL_GRACE_S = 30.0
"""A section process gets this long past its deadline to end its own commands first."""

SECTIONS = (
    Section("cuda", "CUDA-only tests and pinned numbers on CUDA", cuda_section, 90, 20),
    # Real-size data (about a minute to write), a Ray start and 3 epochs of ResNet-50.
    Section("breakdown", "where a real-size trial's time goes", breakdown_section, 120, 60),
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
