"""The prepared GPU check: every GPU figure of relif-ray in one run of at most 9 minutes.

    benchmarks/gpu_check.sh OUT                       # on the lent GPU machine (see there)
    python benchmarks/gpu_check.py --out DIR          # where Ray etc. are installed
    python benchmarks/gpu_check.py --out DIR --only graph fidelity    # some sections only
    python benchmarks/gpu_check.py --dry-run --out DIR    # CPU, toy sizes (minutes on 2 cores)

Sections, most important first; each runs in a process of its own, with a deadline (its
share of `--budget-s`, 540 s by default; a longer budget does not lengthen it, see `cap_scale`):
a section that would start with less than it needs is recorded as "skipped: time budget", one
that overruns is killed (its rows so far are kept). The real-size data (795 / 654 synthetic
NYUv2 images at 288x384) are written in the background from the start, while the first
sections use the GPU. Every step time is timed against eager ERM in the same run.

(a) `profile`: one eager ERM and one ERM+ReLiF step (ResNet-50, 288x384, batch 8, bf16,
    channels-last, data on the GPU) under torch.profiler: the host's time to issue a step, the
    step's time, its summed GPU time, kernel launches and ATen calls; what ReLiF adds.
(b) `graph`: ERM and ERM+ReLiF as one CUDA graph against eager steps, and the plain fp32 loop:
    images/s, GPU utilisation, memory (targets: graphed ERM >= 2.1x the plain loop; graphed
    ERM+ReLiF step <= 1.05x graphed ERM's); 10 graphed against 10 eager steps from one state.
(c) `default`: the trial that `sweeps/nyuv2.py --num-gpus 8` runs by default against the same
    command with `--no-gpu-fast-path`: images/s.
(d) `breakdown`: one real-size trial through the sweep's Trainable, epoch by epoch: training
    steps, validation, live audit, checkpoint, the rest (target: training >= 80%).
(e) `fidelity`: ERM, ReLiF and ReLiF-ST x 2 seeds at real size through the real sweep (3 trials
    per GPU, >= 1,500 steps) and report, bf16 then fp32: Bias against same-seed ERM under the
    three audit interfaces, clipped shares, VR, Worst and Macro, lambda at a bound; whether
    bf16 and fp32 agree within the seed spread (report_bf16.md, report_fp32.md).
(f) `packing`: 1, 2 and 3 ERM trials per GPU through the real sweep at real-size epochs:
    aggregate images/s, GPU utilisation, peak memory (target at the best packing: >= 0.8x the
    isolated graphed ERM rate).
(g) `methods`: PCGrad, FairGrad, UPGrad and Nash-MTL images/s, the step-time ratios of every
    method to ERM and TorchJD, then the further methods.
(h) `compile`: ERM through torch.compile's reduce-overhead mode against the CUDA graph.
Then, as time remains, `cuda`: the CUDA-only tests (`pytest -m cuda tests/`) and the pinned
numbers recomputed on CUDA; `repeatability`: the same seed twice on one GPU.

Everything lands in DIR: `gpu_check.json` (every row, the machine, each section's status),
`gpu_check.md` (the same as tables), `gpu_check.log` (every command's output) and the reports
`report_bf16.md`, `report_fp32.md`; the JSON and Markdown are rewritten after every section,
so a run killed from outside still returns what it measured. Nothing is downloaded (models
start from random weights). `--dry-run` runs the orchestration and every row's code on the CPU
at toy sizes with logical GPUs for Ray; what needs CUDA is recorded as skipped.

This file is the table of sections (`SECTIONS`) and the orchestration: a process per section,
the budget, the command line. Each section is a module of its own with one function that takes
a `Check` (`gpu_profile.py`, `gpu_graph.py`, `gpu_default.py`, `gpu_breakdown.py`,
`gpu_fidelity.py`, `gpu_sweeps.py`, `gpu_methods.py`, `gpu_compile.py`, `gpu_cuda.py`,
`gpu_repeatability.py`); what they share (`Check`, `Size`, the real-size data, commands run
under the deadline) is in `gpu_common.py`, the JSON and Markdown in `gpu_report.py`. A new
section is a new module and one entry in `SECTIONS`.
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
from gpu_common import LOG_FILE, OUT_OF_TIME, REPO, Check, Section, start_real_data
from gpu_compile import compile_section
from gpu_cuda import cuda_section
from gpu_default import default_section
from gpu_fidelity import fidelity_section
from gpu_graph import graph_section
from gpu_methods import methods_section
from gpu_profile import profile_section
from gpu_repeatability import repeatability_section
from gpu_report import Report, machine_info, print_summary
from gpu_sweeps import packing_section

BUDGET_S = 540.0
"""The whole check on one GPU: 9 minutes."""
KILL_GRACE_S = 30.0
"""A section process gets this long past its deadline to end its own commands first."""

SECTIONS = (
    # (name, title, function, cap in s of a 540-s budget on an H100, least time it needs)
    Section("profile", "(a) one eager ERM and ERM+ReLiF step, profiled", profile_section, 40, 20),
    Section("graph", "(b) the step as one CUDA graph against eager", graph_section, 95, 40),
    Section("default", "(c) the default sweep trial against no fast path", default_section, 40, 25),
    Section("breakdown", "(d) where a real-size trial's time goes", breakdown_section, 75, 45),
    Section("fidelity", "(e) ReLiF at real size, bf16 then fp32", fidelity_section, 290, 240),
    Section("packing", "(f) 1, 2 and 3 trials per GPU", packing_section, 180, 60),
    Section("methods", "(g) PCGrad, FairGrad, UPGrad, Nash-MTL", methods_section, 90, 20),
    Section(
        "compile", "(h) torch.compile reduce-overhead against the graph", compile_section, 90, 90
    ),  # fmt: skip
    Section("cuda", "CUDA-only tests and pinned numbers on CUDA", cuda_section, 90, 30),
    Section("repeatability", "same seed twice on one GPU", repeatability_section, 60, 20),
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
    """What every section's cap is multiplied by. On a GPU the caps are sized for a 540 s
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
    needs_data = {"breakdown", "fidelity", "packing"} & set(args.only or [s.name for s in SECTIONS])
    writer = start_real_data(workdir, args.dry_run, log) if needs_data else None
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
        if writer is not None:
            writer.kill()
            writer.wait()
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
