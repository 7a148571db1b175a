"""The `fidelity` suite of the GPU check: does ReLiF cut the fixed-delta Bias at the paper's
NYUv2 size? The fidelity experiment (`sweeps/fidelity.py`: ERM, `relif` and `relif-st` through
the real sweep and report) on 795 / 654 synthetic images at 288x384, ResNet-50 from random
weights, 2 seeds, 3 trials per GPU, the step budget that fits (at least `MIN_STEPS`), in bf16
and then, as time allows, fp32: its rows (information: its targets are the CPU size's), and
whether the two precisions agree within the seed-to-seed spread. The reports are kept as
report_<precision>.md."""

from __future__ import annotations

import json
import math
import shutil
import statistics
import sys

from harness import OUT_OF_TIME, Context, Row
from sweep import real_data
from targets import TARGETS
from throughput import GRAPHED

MIN_STEPS = 1500
SWEEP_SECONDS = 170.0
"""The training time the step budget is sized for: with set-up, validations, checkpoints and
the report the sweep takes about 4 minutes."""
TRIALS, PER_GPU = 6, 3
LABELS = ("relif", "relif-st")


def step_budget(ctx: Context) -> int:
    """The largest step budget of 6 trials, 3 per GPU, that trains for about `SWEEP_SECONDS`
    at the graphed ERM rate the `graph` suite measured (at least `MIN_STEPS`, rounded down to
    hundreds); at toy size 4 steps."""
    if ctx.toy:
        return 4
    rate = ctx.earlier_row(GRAPHED)
    if rate is None:
        return MIN_STEPS
    return max(MIN_STEPS, 100 * math.floor(rate.value * SWEEP_SECONDS / (8 * TRIALS) / 100))


def fidelity_suite(ctx: Context) -> None:
    steps, rows = step_budget(ctx), {}
    for precision in ("bf16", "fp32"):
        what = f"ReLiF at real size, {precision}, {steps} steps"
        if not ctx.has_time(240 if precision == "bf16" else 300):
            ctx.skip(what, OUT_OF_TIME)
            continue
        with ctx.step(what):
            rows[precision] = precision_rows(ctx, precision, steps)
    if len(rows) == 2:
        target = TARGETS["bf16 - fp32 Bias ratio"]
        for label in LABELS:  # the paper's interface: bf16's and fp32's mean Bias ratio
            name = f"Bias@delta_p75 {label} / ERM (a) q10-q90"
            bf16, fp32 = rows["bf16"][name], rows["fp32"][name]
            spread = max(statistics.stdev(r.per_seed.values()) for r in (bf16, fp32))
            difference = abs(bf16.value - fp32.value)
            result = "agree" if difference <= spread else "disagree"
            ctx.row(f"{label}: bf16 - fp32 Bias ratio, against the seed spread", difference, "",
                    f"bf16 {bf16.value:.3f}, fp32 {fp32.value:.3f}; seed-to-seed spread "
                    f"{spread:.3f}", target=target.text, result=result)  # fmt: skip


def precision_rows(ctx: Context, precision: str, steps: int) -> dict[str, Row]:
    """One run of the experiment at `precision`: its rows (named with the precision), its
    report copied to the output folder; the rows by their own name."""
    out = ctx.workdir / f"fidelity-{precision}"
    shutil.rmtree(out, ignore_errors=True)
    backbone, lr = ("resnet18", "1e-3") if ctx.toy else ("resnet50", "1e-4")
    command = [sys.executable, "sweeps/fidelity.py", "--out", str(out), "--no-targets"]
    command += ["--data-dir", str(real_data(ctx)), "--seeds", "2", "--steps", str(steps)]
    command += ["--backbone", backbone, "--lr", lr, "--n-boot", "0", "--", "--num-gpus", "1"]
    command += ["--gpus-per-trial", f"{1 / PER_GPU:.3f}", "--max-failures", "0"]
    command += ["--precision", precision]
    code = ctx.run(command)
    if not (out / "fidelity.json").exists():
        raise RuntimeError(f"sweeps/fidelity.py exited {code} without its rows (see the log)")
    found = {}
    for values in json.loads((out / "fidelity.json").read_text())["rows"]:
        row = Row(**{**values, "group": ""})
        found[row.name] = row
        row.name = f"{row.name}, {precision}"
        ctx.add(row)
    if ctx.out is not None:
        shutil.copy(out / "report" / "report.md", ctx.out / f"report_{precision}.md")
    return found
