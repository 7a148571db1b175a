"""The `profile` suite: where one eager training step's time goes, host and GPU, for ERM and
ERM + ReLiF at the GPU rows' size (ResNet-50 at 288x384, batch 8, bf16, channels-last, data on
the GPU; toy size on a CPU), from torch.profiler; then what ReLiF adds. Per step, over
`PROFILED_STEPS` steps issued back to back (no host synchronisation between them, as in
training):

- host_ms: the host's time to issue the step (until the call returns; the GPU may still be
  working): when it exceeds kernel_ms, the GPU waits for the host;
- wall_ms: the step's time with the GPU's work done (all steps, then one synchronisation);
- kernel_ms: the summed time of the step's GPU activity (kernels, copies, fills);
- launches: its kernel launches (the CUDA runtime's launch calls);
- aten_calls: its ATen operator calls (dispatch work on the host).
"""

from __future__ import annotations

import time

import torch
from harness import Context
from torch.profiler import ProfilerActivity, profile
from workers import WORKER_WARMUP_STEPS, data_root, trial_config

PROFILED_STEPS = 5
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
"""The CUDA runtime and driver calls that launch a kernel, as the profiler names them."""
FIGURES = {
    "host_ms": ("host time to issue a step", "ms"),
    "wall_ms": ("step time", "ms"),
    "kernel_ms": ("GPU time of a step (kernels, copies)", "ms"),
    "launches": ("kernel launches per step", ""),
    "aten_calls": ("ATen calls per step", ""),
}


def profile_steps(run, steps: int) -> dict[str, float | None]:  # noqa: ANN001
    """Per-step figures of `steps` eager steps of the `TrainingRun` `run` (the module doc). It
    issues the steps one by one (`_train_step`) and reads their trace afterwards, as
    `train_steps` does, so that the host's issue time is not mixed with the trace's sync."""
    cuda = run.device.type == "cuda"
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as profiler:
        start = time.perf_counter()
        for _ in range(steps):
            run._train_step()
        issued = time.perf_counter()
        synchronize()
        done = time.perf_counter()
    run._flush_trace()
    events = profiler.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_us = sum(e.time_range.elapsed_us() for e in kernels)
    return {
        "host_ms": 1e3 * (issued - start) / steps,
        "wall_ms": 1e3 * (done - start) / steps,
        "kernel_ms": kernel_us / 1e3 / steps if cuda else None,
        "launches": sum(e.name in LAUNCH_CALLS for e in events) / steps if cuda else None,
        "aten_calls": sum(e.name.startswith("aten::") for e in events) / steps,
    }


def profile_suite(ctx: Context) -> None:
    measured = {}
    for variant in ("erm", "relif"):
        with ctx.step(f"step profile, {variant}"):
            measured[variant] = profile_variant(ctx, variant)
    if len(measured) == 2:
        for key, (title, unit) in FIGURES.items():
            erm, relif = measured["erm"][key], measured["relif"][key]
            if erm is not None and relif is not None:
                ctx.row(f"{title}, ERM+ReLiF - ERM", relif - erm, unit, "eager steps")


def profile_variant(ctx: Context, variant: str) -> dict:
    """`PROFILED_STEPS` eager steps of `variant` after the workers' warm-up, as rows."""
    from relif_ray.config import ExperimentConfig
    from relif_ray.engine import TrainingRun

    config = trial_config(ctx, data_root(ctx, gpu=True), variant, gpu=True)
    config["train"]["cuda_graph"] = "off"
    run = TrainingRun(ExperimentConfig.from_dict(config))
    run.train_steps(WORKER_WARMUP_STEPS if ctx.cuda else 1)
    figures = profile_steps(run, PROFILED_STEPS)
    detail = (f"{config['model']['backbone']}, batch {config['train']['batch_size']}, bf16, "
              f"channels-last, data on the device, eager; mean of {PROFILED_STEPS} steps issued "
              "back to back (host time: until the last call returned; step time: until the GPU "
              "finished)")  # fmt: skip
    for key, (title, unit) in FIGURES.items():
        value = figures[key]
        ctx.row(f"{title}, {variant}", value, unit, detail,
                result="info" if value is not None else "needs CUDA")  # fmt: skip
    return figures
