"""The prepared GPU check: the suites of `run.SUITES` that have a cap, at the real size on CUDA,
in their priority order (the decisive rows first: `breakdown`, where a real-size trial's time
goes; `packing`, 1 to 4 trials of 8 epochs per GPU; `fused-gpu`, 2, 4 and 8 seeds fused in
one trial against an isolated one; `fidelity`, bf16 against fp32; then
ReLiF's graphed step and the exact methods: `graph`, `profile`, `methods`; then `default`,
`compile`, `cuda` and `repeatability` as time remains), within one budget of at most 9 minutes.

    bash benchmarks/gpu_check.sh OUT                  # on the lent GPU machine (see there)
    python -m benchmarks.gpu_check --out DIR --only graph fidelity    # some suites only
    python -m benchmarks.gpu_check --dry-run --out DIR    # CPU, toy size (minutes on 2 cores)

Each suite runs in a process of its own with a deadline (its cap's share of `--budget-s`): one
that would start with less than it needs is recorded as skipped (the record lists what is
left), one that overruns is killed and keeps its rows (each row is appended as it is measured).
The real-size data are written in the background from the start. DIR gets `gpu_check.json` and
`.md` (rewritten after every suite, so a killed run still returns what it measured),
`gpu_check.log` and the fidelity reports; nothing is downloaded. `--dry-run` runs every suite
at toy size on the CPU, with one logical GPU for Ray.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
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

from benchmarks.harness import OUT_OF_TIME, REPO, Context, Record, Row, markdown
from benchmarks.run import BY_NAME, SUITES, Suite

BUDGET_S = 540.0  # The whole check on one GPU: 9 minutes.
KILL_GRACE_S = 30.0  # a suite's process gets this long past its deadline to end its commands
CHECKED = tuple(suite for suite in SUITES if suite.gpu[0])
LOG_FILE = "gpu_check.log"


def cap_scale(budget_s: float, dry_run: bool, caps_s: float) -> float:
    """What every chosen suite's cap is multiplied by; `caps_s` is the sum of their caps. On a
    GPU the caps are sized for a 540-s budget on an H100: a budget shorter than the chosen
    suites need (540 s, or their caps' sum where it is less, as with `--only cuda`) shrinks
    them in proportion, a longer one leaves them, so the time it adds goes to the suites after
    one that fills its cap. A dry run's toy suites have no estimates: their caps are the same
    shares of whatever budget it has."""
    return budget_s / BUDGET_S if dry_run else min(1.0, budget_s / min(BUDGET_S, caps_s))


def run_section(args: argparse.Namespace) -> int:
    """A suite's process: run it, its rows appended to --rows as they come."""
    torch.set_num_threads(1)  # as run.py: in-process timings on one host thread
    record = args.out / "gpu_check.json"
    earlier = json.loads(args.earlier.read_text())["rows"] if args.earlier else []
    earlier += json.loads(record.read_text())["rows"] if record.exists() else []
    fields = {field.name for field in dataclasses.fields(Row)}
    ctx = Context(
        "toy" if args.dry_run else "real", torch.device("cpu" if args.dry_run else "cuda"),
        args.workdir, args.deadline, args.rows, args.out, args.section,
        earlier=[Row(**{k: v for k, v in row.items() if k in fields}) for row in earlier],
    )  # fmt: skip
    BY_NAME[args.section].run(ctx)
    return 0


def run_all(args: argparse.Namespace) -> int:
    """Every chosen suite in order, each in its own process, within the budget."""
    from benchmarks.sweep import start_real_data

    out = args.out.resolve()
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check.py: error: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
        return 2
    size, device = ("toy", "cpu") if args.dry_run else ("real", "cuda")
    record = Record(f"python -m benchmarks.gpu_check {' '.join(args.argv)}", size, device, out,
                    "gpu_check", dry_run=args.dry_run, budget_s=args.budget_s)  # fmt: skip
    args.earlier = earlier_record(args.earlier, record.payload["machine"]["gpu"])
    chosen = [suite for suite in CHECKED if not args.only or suite.name in args.only]
    caps_s = sum(suite.gpu[0] for suite in chosen)
    scale, end = cap_scale(args.budget_s, args.dry_run, caps_s), time.time() + args.budget_s
    log = (out / LOG_FILE).open("a")
    workdir = args.workdir.resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="gpu-"))
    workdir.mkdir(parents=True, exist_ok=True)
    needs_data = {"breakdown", "fidelity", "packing"} & {suite.name for suite in chosen}
    writer = start_real_data(workdir, args.dry_run, log) if needs_data else None
    try:
        for suite in chosen:
            start = time.time()
            if end - start <= suite.gpu[1]:
                record.add(suite.name, suite.title, OUT_OF_TIME, 0.0, [])
                continue
            deadline = start + min(suite.gpu[0] * scale, end - start)
            status, rows = section_process(args, suite, workdir, deadline, log)
            record.add(suite.name, suite.title, status, time.time() - start, rows)
            print(f"{suite.name}: {status} in {time.time() - start:.0f} s", flush=True)
    finally:
        if writer is not None:
            writer.kill()
            writer.wait()
        log.close()
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    record.finish()
    print("\n" + markdown(record.payload))  # the summary, last in the output
    failed = [s for s in record.payload["sections"] if s["status"] not in ("done", OUT_OF_TIME)]
    missed = [r for r in record.payload["rows"] if r["result"] == "FAIL"] and not args.dry_run
    return 1 if failed or missed else 0


def earlier_record(path: Path | None, gpu: str | None) -> Path | None:
    """`--earlier` where it was measured on this GPU model (a precision's numbers from another
    model would mix its kernels into the comparison), else None with a note."""
    if path is None:
        return None
    if json.loads(path.read_text())["machine"].get("gpu") == gpu:
        return path
    print(f"gpu_check.py: {path} is not of this GPU model ({gpu}); its rows are not used")
    return None


def record_problem(path: Path) -> str | None:
    """What makes `path` no gpu_check.json record (None if it is one)."""
    if not path.is_file():
        return "no such file"
    try:
        payload = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"cannot be read as JSON ({error.__class__.__name__})"
    if not isinstance(payload, dict) or not {"machine", "rows"} <= payload.keys():
        return "is not a gpu_check.json record (it lacks 'machine' or 'rows')"
    return None


def section_process(args: argparse.Namespace, suite: Suite, workdir: Path, deadline: float,
                    log) -> tuple[str, list[dict]]:  # noqa: ANN001  # fmt: skip
    """Run one suite in its own process group; (status, rows)."""
    rows_file = workdir / f"{suite.name}.rows.jsonl"
    rows_file.unlink(missing_ok=True)
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--section", suite.name,
               "--out", str(args.out.resolve()), "--workdir", str(workdir), "--rows",
               str(rows_file), "--deadline", repr(deadline)]  # fmt: skip
    command += ["--dry-run"] if args.dry_run else []
    command += ["--earlier", str(args.earlier.resolve())] if args.earlier else []
    log.write(f"\n===== {suite.name} ({suite.title}) =====\n")
    log.flush()
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True, env=environment)  # fmt: skip
    try:
        code = process.wait(timeout=max(1.0, deadline - time.time() + KILL_GRACE_S))
        status = "done" if code == 0 else f"error (exit {code}; see {LOG_FILE})"
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        status = "timed out (killed at its deadline)"
    lines = rows_file.read_text().splitlines() if rows_file.exists() else []
    return status, [json.loads(line) for line in lines]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON, Markdown and log")
    parser.add_argument("--dry-run", action="store_true", help="CPU, toy size, logical GPUs")
    parser.add_argument("--budget-s", type=float, default=None, help="time for the whole "
                        f"check (default {BUDGET_S:.0f}; dry run 1800)")  # fmt: skip
    parser.add_argument("--only", nargs="+", choices=[s.name for s in CHECKED], help="these suites")
    parser.add_argument("--workdir", type=Path, help="keep the data, experiments and reports "
                        "here (default: a temporary folder, removed at the end)")  # fmt: skip
    parser.add_argument("--earlier", type=Path, help="a gpu_check.json of an earlier run on "
                        "this GPU model: its rows are the suites' earlier rows (the fidelity "
                        "suite reuses a precision it holds at the same steps)")  # fmt: skip
    parser.add_argument("--section", choices=[s.name for s in CHECKED], help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    args.out.mkdir(parents=True, exist_ok=True)
    if args.section:
        return run_section(args)
    if args.earlier and (problem := record_problem(args.earlier)):
        parser.error(f"--earlier {args.earlier}: {problem}")
    if args.budget_s is None:
        args.budget_s = 1800.0 if args.dry_run else BUDGET_S
    return run_all(args)


if __name__ == "__main__":
    raise SystemExit(main())
