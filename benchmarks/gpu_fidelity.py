"""The `fidelity` section of the GPU check (e): does ReLiF cut the fixed-delta Bias at the
paper's NYUv2 size? Synthetic NYUv2 at 795 / 654 images of 288x384, ResNet-50 from random
weights, ERM, `relif` and `relif-st` x 2 seeds through the real `sweeps/nyuv2.py` (3 trials per
GPU, the default GPU path) and `relif report`, with the step budget that fits the section
(at least `MIN_STEPS`, the controller scaled to it by `scale_to_budget`): `fidelity.py`'s
rows (Bias@delta_p75 against same-seed ERM under the three audit interfaces, clipped shares,
VR, the Worst and Macro differences, the share of steps with lambda at a bound), in bf16, then
in fp32 as time allows, and whether the two agree within the seed-to-seed spread. The report
is kept as report_<precision>.md."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import statistics

from gpu_common import OUT_OF_TIME, REAL_DATA, TOY_DATA, Check, earlier_row, real_data

MIN_STEPS = 1500
SWEEP_SECONDS = 170.0
"""The training time the step budget is sized for: with set-up, validations, checkpoints and
the report the sweep takes about 4 minutes."""
TRIALS, PER_GPU = 6, 3
LABELS = ("relif", "relif-st")


def fidelity_section(check: Check) -> None:
    from fidelity import Size

    root = real_data(check)
    steps = step_budget(check)
    base = Size(
        **(TOY_DATA if check.dry_run else REAL_DATA), seeds=2, steps=steps, labels=LABELS,
        report_flags=("--no-figures", "--n-boot", "0"), backbone="resnet50", lr=1e-4,
        sweep_flags=("--num-gpus", "1", "--gpus-per-trial", f"{1 / PER_GPU:.3f}",
                     "--max-failures", "0"),
        judged=False,
    )  # fmt: skip
    if check.dry_run:  # the toy size on the CPU, with one logical GPU for the sweep's flags
        base = dataclasses.replace(base, backbone="resnet18", lr=1e-3)
        os.environ.setdefault("RAY_OVERRIDE_RESOURCES", json.dumps({"GPU": 1}))
    rows = {}
    for precision in ("bf16", "fp32"):
        what = f"ReLiF at real size, {precision}, {steps} steps"
        if not check.has_time(240 if precision == "bf16" else 300):
            check.skip(what, OUT_OF_TIME)
            continue
        with check.step(what):
            size = dataclasses.replace(base, sweep_flags=(*base.sweep_flags, "--precision",
                                                          precision))  # fmt: skip
            rows[precision] = precision_rows(check, size, root, precision)
    if len(rows) == 2:
        agreement_rows(check, rows)


def step_budget(check: Check) -> int:
    """The largest step budget of 6 trials, 3 per GPU, that trains for about
    `SWEEP_SECONDS` at the graphed ERM rate the `graph` section measured (at least
    `MIN_STEPS`, rounded down to hundreds); a dry run's is 4 steps."""
    if check.dry_run:
        return 4
    rate = earlier_row(check, "training images/s, erm (graphed)")
    if rate is None:
        return MIN_STEPS
    steps = rate.value * SWEEP_SECONDS / (8 * TRIALS)
    return max(MIN_STEPS, 100 * math.floor(steps / 100))


def precision_rows(check: Check, size: object, root: object, precision: str) -> dict:
    """One sweep and report at `precision`: its rows (group "fidelity-<precision>"), the
    report copied to the output folder; the rows by name."""
    from fidelity import fidelity_rows

    workdir = check.workdir / f"fidelity-{precision}"
    shutil.rmtree(workdir, ignore_errors=True)
    rows = fidelity_rows(size, workdir, root, group=f"realsize {precision}")
    for row in rows:
        row.name = f"{row.name}, {precision}"
    check.add(*rows)
    shutil.copy(workdir / "report" / "report.md", check.out / f"report_{precision}.md")
    return {row.name.rsplit(", ", 1)[0]: row for row in rows}


def agreement_rows(check: Check, rows: dict[str, dict]) -> None:
    """Per label, whether bf16's and fp32's mean Bias ratio (the paper's interface) differ by
    no more than the seed-to-seed spread (the larger sample standard deviation of the two)."""
    for label in LABELS:
        name = f"Bias@delta_p75 {label} / ERM (a) q10-q90"
        bf16, fp32 = rows["bf16"].get(name), rows["fp32"].get(name)
        if bf16 is None or fp32 is None or bf16.per_seed is None or fp32.per_seed is None:
            continue
        spread = max(statistics.stdev(r.per_seed.values()) for r in (bf16, fp32))
        difference = abs(bf16.value - fp32.value)
        check.row(f"{label}: bf16 - fp32 Bias ratio, against the seed spread", difference, "",
                  f"bf16 {bf16.value:.3f}, fp32 {fp32.value:.3f}; seed-to-seed spread "
                  f"{spread:.3f}", "<= spread",
                  "agree" if difference <= spread else "disagree")  # fmt: skip
