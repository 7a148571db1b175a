"""The `packing` section of the GPU check (f): steady-state packing of 1, 2 and 3 trials per GPU
through the real `sweeps/nyuv2.py` (that many ERM trials at `--gpus-per-trial` 1, 1/2, 1/3,
the default GPU path, real-size epochs with their validations and checkpoints): aggregate
images/s over the trials' span, GPU utilisation (NVML), each trial's peak GPU memory; then at
the best packing, the aggregate against the isolated graphed ERM rate (target >= 0.8x)."""

from __future__ import annotations

import json
import math
import time

import torch
from gpu_common import (
    BATCH_SIZE,
    NEEDS_CUDA,
    OUT_OF_TIME,
    Check,
    earlier_row,
    run_command,
    sweep_command,
    trials_of,
)
from timing import verdict
from utilisation import UtilisationSampler

PACKINGS = (1, 2, 3)
PACKED_TARGET = 0.8
"""The sweep's aggregate images/s per GPU at the best packing over the isolated graphed ERM's."""


def packing_section(check: Check) -> None:
    aggregate = {}
    for per_gpu in PACKINGS:
        name = f"sweep aggregate images/s, {per_gpu} trial(s) per GPU"
        if not check.has_time(60):  # Ray's start and shutdown, set-up, 2 real-size epochs
            check.skip(name, OUT_OF_TIME)
            continue
        with check.step(name):
            aggregate[per_gpu] = sweep_throughput(check, per_gpu, name)
    measured = {k: v for k, v in aggregate.items() if v}
    isolated = earlier_row(check, "training images/s, erm (graphed)")
    if measured and isolated is not None:
        best = max(measured, key=measured.get)
        ratio = measured[best] / isolated.value
        detail = f"{best} trial(s) per GPU, the best packing; isolated: the graph section's row"
        check.row("sweep aggregate images/s per GPU / isolated graphed ERM", ratio, "x", detail,
                  f">= {PACKED_TARGET}", verdict(ratio >= PACKED_TARGET))  # fmt: skip


def sweep_throughput(check: Check, per_gpu: int, name: str) -> float | None:
    """One sweep of `per_gpu` ERM trials sharing the GPU: its aggregate images/s over the
    trials' span, the GPU's mean utilisation then and the trials' peak memory (rows); the
    images/s, None if the sweep failed."""
    experiment = f"packing-{per_gpu}"
    command = sweep_command(check, experiment, 1 / per_gpu, per_gpu)
    sampler = None if check.dry_run else UtilisationSampler(torch.device("cuda"), 0, math.inf, 0.25)
    if sampler is not None:
        sampler.start()
    start = time.time()
    code = run_command(check, command)
    wall = time.time() - start
    if sampler is not None:
        sampler.stopped.set()
    trials = trials_of(check.workdir / "results" / experiment)
    if code != 0 or len(trials) < per_gpu:
        detail = f"sweeps/nyuv2.py exited {code}; {len(trials)} trial(s) finished"
        check.row(name, None, "img/s", detail, result="FAIL")
        return None
    first = min(t["started_at"] for t in trials)
    last = max(t["finished_at"] for t in trials)
    images_per_s = sum(t["steps"] for t in trials) * BATCH_SIZE / (last - first)
    devices = sorted({trial["device"] for trial in trials})
    on_cpu = not check.dry_run and any(not device.startswith("cuda") for device in devices)
    check.row(name, images_per_s, "img/s",
              f"{len(trials)} ERM trial(s) x {trials[0]['steps']} steps of batch {BATCH_SIZE}, "
              f"{check.size.packing_epochs} epochs with validation, live audit and checkpoints, "
              f"over the trials' span {last - first:.1f} s; the command took {wall:.1f} s (Ray "
              f"start and shutdown included); peak GPU memory per trial "
              f"{peak_memory(check, experiment)}; trials ran on {', '.join(devices)}",
              "trials on cuda", "FAIL" if on_cpu else "info")  # fmt: skip
    if sampler is None:
        check.skip(f"GPU utilisation, {per_gpu} trial(s) per GPU", NEEDS_CUDA)
        return images_per_s
    mean = sampler.mean(first, last)
    check.row(f"GPU utilisation, {per_gpu} trial(s) per GPU", mean, "%",
              f"NVML every 0.25 s over the trials' span; {len(sampler.samples)} samples",
              result="info" if mean is not None else "no reading")  # fmt: skip
    return images_per_s


def peak_memory(check: Check, experiment: str) -> str:
    """The trials' peak GPU memory (MiB) as their last results report it."""
    peaks = []
    for results in sorted((check.workdir / "results" / experiment).glob("*/result.json")):
        lines = results.read_text().splitlines()
        peaks.append(json.loads(lines[-1]).get("cuda_peak_mb") if lines else None)
    shown = [f"{peak:.0f}" for peak in peaks if peak is not None]
    return f"{', '.join(shown)} MiB" if shown else "not reported (CPU)"
