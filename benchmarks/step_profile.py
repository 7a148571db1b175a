"""Where one training step's time goes: the host's and the GPU's share, from torch.profiler.

For a `TrainingRun` already warmed up, `profile_steps` runs `steps` eager steps back to back
(no host synchronisation between them, as in training) under torch.profiler and reports per
step:

- host_ms: the host's time to issue the step (from its start until the call returns; the GPU
  may still be working): when it exceeds kernel_ms the GPU waits for the host;
- wall_ms: the step's time with the GPU's work done (all steps, then one synchronisation);
- kernel_ms: the summed time of the step's GPU activity (its kernels, copies and fills, as
  the profiler records them on the device);
- launches: its kernel launches (the CUDA runtime's launch calls);
- aten_calls: its ATen operator calls (dispatch work on the host).

On a CPU (a dry run) kernel_ms and launches are None.
"""

from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile

LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
"""The CUDA runtime and driver calls that launch a kernel, as the profiler names them."""


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_steps(run: object, steps: int = 5) -> dict[str, float | None]:
    """Per-step figures of `steps` eager training steps of `run` (module docstring)."""
    cuda = run.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    synchronize(run.device)
    with profile(activities=activities) as profiler:
        start = time.perf_counter()
        for _ in range(steps):
            run._train_step()
        issued = time.perf_counter()
        synchronize(run.device)
        done = time.perf_counter()
    run._flush_trace()
    events = profiler.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    device_us = sum(e.time_range.elapsed_us() for e in kernels)
    return {
        "host_ms": 1e3 * (issued - start) / steps,
        "wall_ms": 1e3 * (done - start) / steps,
        "kernel_ms": device_us / 1e3 / steps if cuda else None,
        "launches": sum(e.name in LAUNCH_CALLS for e in events) / steps if cuda else None,
        "aten_calls": sum(e.name.startswith("aten::") for e in events) / steps,
    }
