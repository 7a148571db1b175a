"""The `realsize` section of the GPU check: synthetic NYUv2 at 288x384 through the real sweep
and `relif report`, in bf16 then fp32: the report's Bias@delta_p75, VR@delta_p75 and Worst."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from gpu_common import BATCH_SIZE, OUT_OF_TIME, Check, run_command, sweep_command


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
