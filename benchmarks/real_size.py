"""The GPU check's real sweeps on the data of the paper's NYUv2 size (`sweep.real_data`): the
`fidelity` suite (the fidelity experiment, `sweeps/fidelity.py`, in bf16 then fp32, and whether
the two agree within the seed spread) and the `packing` suite (1, 2 and 3 ERM trials sharing
one GPU through `sweeps/nyuv2.py`, against the isolated graphed ERM rate of the same run)."""

from __future__ import annotations

import itertools
import json
import math
import shutil
import statistics
import sys
import time

from harness import NEEDS_CUDA, NEEDS_GPU, OUT_OF_TIME, Context, Row
from sweep import TIMED_PARTS, real_data
from targets import TARGETS
from throughput import GRAPHED
from workers import UtilisationSampler

from relif_ray.experiment.storage import read_json_lines

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


PACKINGS = (1, 2, 3)
BATCH_SIZE = 8


def sweep_command(ctx: Context, name: str, gpus_per_trial: float, seeds: int) -> list[str]:
    """`sweeps/nyuv2.py` of ERM x `seeds` on the real-size data with the sweep's default GPU
    path: one GPU, random weights, 2 real-size epochs (1 at toy size), no retries."""
    epochs, backbone = (1, "resnet18") if ctx.toy else (2, "resnet50")
    command = [sys.executable, "sweeps/nyuv2.py", "--data-dir", str(real_data(ctx))]
    command += ["--methods", "erm", "--seeds", str(seeds), "--epochs", str(epochs)]
    command += ["--backbone", backbone, "--batch-size", str(BATCH_SIZE), "--pretrained", "none"]
    command += ["--num-gpus", "1", "--gpus-per-trial", f"{gpus_per_trial:.3f}"]
    command += ["--max-failures", "0", "--storage", str(ctx.workdir / "results")]
    return command + ["--name", name]


def packing_suite(ctx: Context) -> None:
    if not ctx.gpu_rows:
        for per_gpu in PACKINGS:
            ctx.skip(f"sweep aggregate images/s, {per_gpu} trial(s) per GPU", NEEDS_GPU)
            ctx.skip(f"GPU utilisation, {per_gpu} trial(s) per GPU", NEEDS_GPU)
        return
    aggregate = {}
    for per_gpu in PACKINGS:
        name = f"sweep aggregate images/s, {per_gpu} trial(s) per GPU"
        if not ctx.has_time(60):  # Ray's start and shutdown, set-up, 2 real-size epochs
            ctx.skip(name, OUT_OF_TIME)
            continue
        with ctx.step(name):
            aggregate[per_gpu] = sweep_throughput(ctx, per_gpu, name)
    measured = {k: v for k, v in aggregate.items() if v}
    isolated = ctx.earlier_row(GRAPHED)
    if measured and isolated is not None:
        best = max(measured, key=measured.get)
        name = "sweep aggregate images/s per GPU / isolated graphed ERM"
        ctx.judged(name, name, measured[best] / isolated.value, "x", f"{best} trial(s) per GPU, "
                   "the best packing; isolated: the graph suite's row")  # fmt: skip


def sweep_throughput(ctx: Context, per_gpu: int, name: str) -> float | None:
    """One sweep of `per_gpu` ERM trials sharing the GPU: its aggregate images/s over the
    trials' span, the GPU's mean utilisation then and the trials' peak memory (rows); the
    images/s, None if the sweep failed."""
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
    trials = [json.loads(path.read_text()) for path in outputs]
    if code != 0 or len(trials) < per_gpu:
        ctx.row(name, None, "img/s", f"sweeps/nyuv2.py exited {code}; {len(trials)} trial(s) "
                "finished", result="FAIL")  # fmt: skip
        return None
    first, last = min(t["started_at"] for t in trials), max(t["finished_at"] for t in trials)
    images_per_s = sum(t["steps"] for t in trials) * BATCH_SIZE / (last - first)
    devices = sorted({trial["device"] for trial in trials})
    results = [read_json_lines(path) for path in sorted(experiment.glob("*/result.json"))]
    peaks = [rows[-1].get("cuda_peak_mb") for rows in results if rows]
    shown = ", ".join(f"{p:.0f}" for p in peaks if p is not None)
    peak = f"{shown} MiB" if shown else "not reported (CPU)"
    on_cpu = ctx.cuda and any(not device.startswith("cuda") for device in devices)
    ctx.row(name, images_per_s, "img/s",
            f"{len(trials)} ERM trial(s) x {trials[0]['steps']} steps of batch {BATCH_SIZE}, "
            "with validation, live audit and checkpoints, over the trials' span "
            f"{last - first:.1f} s; the command took {wall:.1f} s (Ray start and shutdown "
            f"included); peak GPU memory per trial {peak}; trials ran on {', '.join(devices)}",
            target="trials on cuda", result="FAIL" if on_cpu else "info")  # fmt: skip
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
    ctx: Context, per_gpu: int, trials: list[dict], results: list[list[dict]]
) -> None:
    """Where the packed trials' time went, from what each reported (no extra run): the mean
    seconds per trial of the epochs' timed parts, the rest of the epochs, and what lies outside
    them (set-up: data to the device, model, warm-up; checkpoints; Tune's bookkeeping); the
    value is the train share of a trial's span."""
    spans = [trial["finished_at"] - trial["started_at"] for trial in trials]
    parts = {part: [sum(r.get(f"time_{part}_s", 0.0) for r in rows) for rows in results]
             for part in TIMED_PARTS}  # fmt: skip
    epochs = [sum(r["time_this_iter_s"] for r in rows) for rows in results]
    mean = {part: statistics.fmean(values) for part, values in parts.items()}
    mean["rest of the epochs"] = statistics.fmean(epochs) - sum(mean[part] for part in TIMED_PARTS)
    mean["outside the epochs"] = statistics.fmean(spans) - statistics.fmean(epochs)
    share = mean["train"] / statistics.fmean(spans)
    ctx.row(f"train share of a trial's span, {per_gpu} trial(s) per GPU", share, "",
            f"mean seconds per trial over {len(trials)} trial(s) of {len(results[0])} epochs: "
            + ", ".join(f"{name} {value:.2f}" for name, value in mean.items()))  # fmt: skip
