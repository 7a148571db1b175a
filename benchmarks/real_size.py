"""The GPU check's real sweeps on the data of the paper's NYUv2 size (`sweep.real_data`): the
`fidelity` suite (the fidelity experiment, `benchmarks.fidelity`, in bf16 then fp32, and whether
the two agree within the seed spread) and the `packing` suite (1, 2, 3 and 4 ERM trials of 8
epochs sharing one GPU through `sweeps/nyuv2.py`, against the isolated graphed ERM rate it
measures first)."""

from __future__ import annotations

import itertools
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

from benchmarks.harness import NEEDS_CUDA, NEEDS_GPU, OUT_OF_TIME, Context, Row, trained_on
from benchmarks.sweep import TIMED_PARTS, real_data
from benchmarks.targets import TARGETS
from benchmarks.throughput import GRAPHED
from benchmarks.workers import (
    UtilisationSampler,
    data_root,
    setting_text,
    timed_worker,
    trial_config,
    worker_rows,
)
from relif_ray.experiment.outputs import read_trial_record, seed_records
from relif_ray.experiment.record import CUDA_PEAK_MB, TrialRecord, part_seconds
from relif_ray.experiment.storage import read_json_lines

ISOLATED = "isolated graphed ERM images/s (the packing's reference)"
"""One ERM worker alone on the GPU, graphed (the `graph` suite's ERM row, measured here so that
the packing rows stand first in the check)."""
MIN_STEPS = 1500
SWEEP_SECONDS = 170.0
"""The training time the step budget is sized for: with set-up, validations, checkpoints and
the report the sweep takes about 4 minutes."""
TRIALS, PER_GPU = 6, 3
LABELS = ("relif", "relif-st")
COMPARED = {"Bias ratio": "Bias@delta_p75 {} / ERM (a) q10-q90", "Worst - ERM": "Worst {} - ERM"}
"""What bf16 and fp32 must agree on within the seed spread (the GPU default's rule): each
label's mean Bias ratio to ERM under the paper's interface, and its mean Worst against ERM's."""


def step_budget(ctx: Context) -> int:
    """The largest step budget of 6 trials, 3 per GPU, that trains for about `SWEEP_SECONDS`
    at the graphed ERM rate the `graph` or `packing` suite measured (at least `MIN_STEPS`,
    rounded down to hundreds); at toy size 4 steps."""
    if ctx.toy:
        return 4
    rate = ctx.earlier_row(GRAPHED) or ctx.earlier_row(ISOLATED)
    if rate is None:
        return MIN_STEPS
    return max(MIN_STEPS, 100 * math.floor(rate.value * SWEEP_SECONDS / (8 * TRIALS) / 100))


def fidelity_suite(ctx: Context) -> None:
    steps, rows = step_budget(ctx), {}
    for precision in ("bf16", "fp32"):
        what = f"ReLiF at real size, {precision}, {steps} steps"
        recorded = recorded_rows(ctx, precision, steps)
        if recorded:
            rows[precision] = recorded
            ctx.row(what, None, detail="not run: its rows are those of the --earlier record")
            continue
        if not ctx.has_time(240 if precision == "bf16" else 300):
            ctx.skip(what, OUT_OF_TIME)
            continue
        with ctx.step(what):
            rows[precision] = precision_rows(ctx, precision, steps)
    if len(rows) == 2:
        for label, (what, name) in itertools.product(LABELS, COMPARED.items()):
            bf16, fp32 = rows["bf16"][name.format(label)], rows["fp32"][name.format(label)]
            spread = max(statistics.stdev(r.per_seed.values()) for r in (bf16, fp32))
            difference = abs(bf16.value - fp32.value)
            result = "agree" if difference <= spread else "disagree"
            ctx.row(f"{label}: bf16 - fp32 {what}, against the seed spread", difference, "",
                    f"bf16 {bf16.value:.3f}, fp32 {fp32.value:.3f}; seed-to-seed spread "
                    f"{spread:.3f}", target=TARGETS[f"bf16 - fp32 {what}"].text,
                    result=result)  # fmt: skip


def recorded_rows(ctx: Context, precision: str, steps: int) -> dict[str, Row]:
    """The rows of a run at `precision` and `steps` that an earlier record of the same GPU
    model holds (`gpu_check.py --earlier`), by their own name; empty if it holds none. They
    let a short window run fp32 alone against a recorded bf16 run."""
    suffix = f", {precision}"
    found = {r.name.removesuffix(suffix): r for r in ctx.earlier if r.name.endswith(suffix)}
    setting = found.get("setting")
    if setting is None or f", {steps} steps," not in setting.detail:
        return {}
    return found


def precision_rows(ctx: Context, precision: str, steps: int) -> dict[str, Row]:
    """One run of the experiment at `precision`: its rows (named with the precision; its
    setting row names the device its trials reported, `trained_on`), its report copied to the
    output folder; the rows by their own name."""
    out = ctx.workdir / f"fidelity-{precision}"
    shutil.rmtree(out, ignore_errors=True)
    backbone, lr = ("resnet18", "1e-3") if ctx.toy else ("resnet50", "1e-4")
    command = [sys.executable, "-m", "benchmarks.fidelity", "--out", str(out), "--no-targets"]
    command += ["--data-dir", str(real_data(ctx)), "--seeds", "2", "--steps", str(steps)]
    command += ["--backbone", backbone, "--lr", lr, "--n-boot", "0", "--", "--num-gpus", "1"]
    command += ["--gpus-per-trial", f"{1 / PER_GPU:.3f}", "--max-failures", "0"]
    command += ["--precision", precision]
    code = ctx.run(command)
    record = out / "fidelity.json"
    values = json.loads(record.read_text())["rows"] if record.exists() else []
    if not values:
        raise RuntimeError(f"benchmarks.fidelity exited {code} without its rows (see the log)")
    records = sorted(out.glob("results/*/*/checkpoint_*/outputs/trial.json"))
    what = f"ReLiF at real size, {precision}"
    devices = trained_on(ctx, [record.device for record in trial_records(records)], what)
    found = {}
    for fields in values:
        row = Row(**{**fields, "group": ""})
        row.detail += f"; {devices}" if row.name == "setting" else ""
        found[row.name] = row
        row.name = f"{row.name}, {precision}"
        ctx.add(row)
    if ctx.out is not None:
        shutil.copy(out / "report" / "report.md", ctx.out / f"report_{precision}.md")
    return found


PACKINGS = (1, 2, 3, 4)
"""Trials sharing one GPU, in the order measured: the decision of `--gpus-per-trial`."""
PACKING_EPOCHS = 8
"""A real trial's length for the packing rows: per-epoch work (validation, audit, checkpoints)
recurs in every epoch, so packing must pay for it over several (2 epochs hid it in set-up)."""
BATCH_SIZE = 8


def packing_seconds(per_gpu: int) -> float:
    """The least time to start a packing's sweep (s): Ray's start and shutdown, set-up, and
    `PACKING_EPOCHS` real-size epochs of `per_gpu` trials (an estimate for an H100 or H200 at
    the isolated graphed rate, about 25 s of trial time each with validation)."""
    return 20.0 + 25.0 * per_gpu


def sweep_command(ctx: Context, name: str, gpus_per_trial: float, seeds: int) -> list[str]:
    """`sweeps/nyuv2.py` of ERM x `seeds` on the real-size data with the sweep's default
    config and GPU path: one GPU, random weights, `PACKING_EPOCHS` real-size epochs (1 at toy
    size), no retries."""
    epochs, backbone = (1, "resnet18") if ctx.toy else (PACKING_EPOCHS, "resnet50")
    command = [sys.executable, "sweeps/nyuv2.py", "--data-dir", str(real_data(ctx))]
    command += ["--methods", "erm", "--seeds", str(seeds), "--epochs", str(epochs)]
    command += ["--backbone", backbone, "--batch-size", str(BATCH_SIZE), "--pretrained", "none"]
    command += ["--num-gpus", "1", "--gpus-per-trial", f"{gpus_per_trial:.3f}"]
    command += ["--max-failures", "0", "--storage", str(ctx.workdir / "results")]
    return command + ["--name", name]


def packing_suite(ctx: Context) -> None:
    """The isolated graphed ERM rate, then 1, 2, 3 and 4 ERM trials sharing the GPU, each
    packing's rows written as it ends; the best packing judged against the isolated rate."""
    if not ctx.gpu_rows:
        ctx.skip(ISOLATED, NEEDS_GPU)
        for per_gpu in PACKINGS:
            ctx.skip(f"sweep aggregate images/s, {per_gpu} trial(s) per GPU", NEEDS_GPU)
            ctx.skip(f"GPU utilisation, {per_gpu} trial(s) per GPU", NEEDS_GPU)
        return
    with ctx.step(ISOLATED):
        isolated_rate(ctx)
    isolated = ctx.earlier_row(ISOLATED)
    ratios = {}
    for per_gpu in PACKINGS:
        name = f"sweep aggregate images/s, {per_gpu} trial(s) per GPU"
        if not ctx.has_time(packing_seconds(per_gpu)):
            ctx.skip(name, OUT_OF_TIME)
            continue
        with ctx.step(name):
            aggregate = sweep_throughput(ctx, per_gpu, name)
            if aggregate and isolated is not None:
                ratios[per_gpu] = aggregate / isolated.value
                ctx.row(f"sweep aggregate / isolated graphed ERM, {per_gpu} trial(s) per GPU",
                        ratios[per_gpu], "x", f"{aggregate:.0f} against {isolated.value:.0f} "
                        "img/s")  # fmt: skip
    if ratios:
        best = max(ratios, key=ratios.get)
        name = "sweep aggregate images/s per GPU / isolated graphed ERM"
        ctx.judged(name, name, ratios[best], "x", f"{best} trial(s) per GPU, the best of "
                   f"{', '.join(map(str, ratios))}; isolated: {ISOLATED}")  # fmt: skip


def isolated_rate(ctx: Context) -> None:
    """One graphed ERM worker of the GPU rows alone on the GPU: its rows, `ISOLATED` last."""
    root = data_root(ctx, gpu=True)
    config = trial_config(ctx, root, "erm", gpu=True)
    result = timed_worker(ctx, config)
    setting = setting_text(config, root)
    worker_rows(ctx, "erm (graphed, the packing's reference)", result, setting)
    ctx.row(ISOLATED, result["images_per_s"], "img/s", f"{setting}, {result['steps']} steps")


def sweep_throughput(ctx: Context, per_gpu: int, name: str) -> float | None:
    """One sweep of `per_gpu` ERM trials sharing the GPU: its aggregate images/s over the
    trials' span, the GPU's mean utilisation then and each trial's peak memory (rows); the
    images/s, None if the sweep failed. Its trials must have trained on the GPU
    (`trained_on`)."""
    experiment = ctx.workdir / "results" / f"packing-{per_gpu}"
    sampler = UtilisationSampler(ctx.device, 0.25) if ctx.cuda else None
    if sampler is not None:
        sampler.start()
    start = time.time()
    code = ctx.run(sweep_command(ctx, experiment.name, 1 / per_gpu, per_gpu))
    wall = time.time() - start
    if sampler is not None:
        sampler.stopped.set()
    outputs = sorted(experiment.glob("*/checkpoint_*/outputs/trial.json"))
    trials = trial_records(outputs)
    if code != 0 or len(trials) < per_gpu:
        ctx.row(name, None, "img/s", f"sweeps/nyuv2.py exited {code}; {len(trials)} trial(s) "
                "finished", result="FAIL")  # fmt: skip
        return None
    devices = trained_on(ctx, [trial.device for trial in trials], name)
    first, last = min(t.started_at for t in trials), max(t.finished_at for t in trials)
    images_per_s = sum(t.steps for t in trials) * BATCH_SIZE / (last - first)
    results = [read_json_lines(path) for path in sorted(experiment.glob("*/result.json"))]
    epochs = len(results[0])
    ctx.row(name, images_per_s, "img/s",
            f"{len(trials)} ERM trial(s) x {trials[0].steps} steps ({epochs} epochs) of batch "
            f"{BATCH_SIZE}, with validation, live audit and checkpoints, over the trials' span "
            f"{last - first:.1f} s; the command took {wall:.1f} s (Ray start and shutdown "
            f"included); {devices}")  # fmt: skip
    peaks = [rows[-1].get(CUDA_PEAK_MB) for rows in results if rows]
    shown = [peak for peak in peaks if peak is not None]
    ctx.row(f"peak GPU memory per trial, {per_gpu} trial(s) per GPU",
            max(shown) if shown else None, "MiB", "the largest of the trials' "
            f"torch.cuda.max_memory_allocated: {', '.join(f'{p:.0f}' for p in shown)}",
            result="info" if shown else NEEDS_CUDA)  # fmt: skip
    time_split_row(ctx, per_gpu, trials, results)
    if sampler is None:
        ctx.skip(f"GPU utilisation, {per_gpu} trial(s) per GPU", NEEDS_CUDA)
        return images_per_s
    mean = sampler.mean(first, last)
    ctx.row(f"GPU utilisation, {per_gpu} trial(s) per GPU", mean, "%",
            f"NVML every 0.25 s over the trials' span; {len(sampler.samples)} samples",
            result="info" if mean is not None else "no reading")  # fmt: skip
    return images_per_s


def time_split_row(
    ctx: Context, per_gpu: int, trials: list[TrialRecord], results: list[list[dict]]
) -> None:
    """Where the packed trials' time went, from what each reported (no extra run): the mean
    seconds per trial of the epochs' timed parts, the rest of the epochs, and what lies outside
    them (set-up: data to the device, model, warm-up; checkpoints; Tune's bookkeeping); the
    value is the train share of a trial's span."""
    spans = [trial.finished_at - trial.started_at for trial in trials]
    parts = {part: [sum(r.get(part_seconds(part), 0.0) for r in rows) for rows in results]
             for part in TIMED_PARTS}  # fmt: skip
    epochs = [sum(r["time_this_iter_s"] for r in rows) for rows in results]
    mean = {part: statistics.fmean(values) for part, values in parts.items()}
    mean["rest of the epochs"] = statistics.fmean(epochs) - sum(mean[part] for part in TIMED_PARTS)
    mean["outside the epochs"] = statistics.fmean(spans) - statistics.fmean(epochs)
    share = mean["train"] / statistics.fmean(spans)
    ctx.row(f"train share of a trial's span, {per_gpu} trial(s) per GPU", share, "",
            f"mean seconds per trial over {len(trials)} trial(s) of {len(results[0])} epochs: "
            + ", ".join(f"{name} {value:.2f}" for name, value in mean.items()))  # fmt: skip


def trial_records(paths: list[Path]) -> list[TrialRecord]:
    """The record of each seed of the trials whose trial.json files are `paths`."""
    return [
        record
        for path in paths
        for record, _ in seed_records(path.parent, read_trial_record(path.parent))
    ]
