"""The `sweeps` section of the GPU check: two real sweeps of 2 ERM trials, one and two trials per
GPU (`--gpus-per-trial 1` and `0.5`): aggregate images/s and GPU utilisation."""

from __future__ import annotations

import math
import time

import torch
from gpu_common import (
    BATCH_SIZE,
    NEEDS_CUDA,
    OUT_OF_TIME,
    Check,
    run_command,
    sweep_command,
    trials_of,
)
from utilisation import UtilisationSampler


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
