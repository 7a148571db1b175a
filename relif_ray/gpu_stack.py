"""The GPU stack of a machine, and what a sweep's GPU trials need of it (no Ray import).

A GPU trial needs an NVIDIA driver at least as new as the CUDA runtime that torch was built
with (`torch.version.cuda`, the wheel's own metadata): an older one fails only once a trial
initialises CUDA, on the cluster, after scheduling. `query_gpu_stack` reads this machine's
stack (the driver and each GPU's model and compute capability from `nvidia-smi`, which ships
with the driver; the CUDA runtime from torch); `check_driver` refuses, in one line, a driver
older than `MINIMUM_DRIVER` says that runtime needs. `relif_ray.tuning.cluster` runs
`query_gpu_stack` on every GPU node of the sweep's Ray before any trial starts.

bf16 autocast runs natively only on GPUs of compute capability 8.0 and newer (Ampere and
later); on older ones (V100, T4) CUDA emulates it, slower than fp32 and with no gain, so
`forward_precision` turns a bf16 forward into fp32 there, with one logged line.

Channels-last is a GPU layout. On a CPU, torch 2.14.1's oneDNN convolution backward with
channels-last tensors corrupts the heap on CPUs without AVX-512 (seen on an AMD EPYC: an abort,
"double free or corruption", in `mkldnn_convolution_backward_weights`, in about two runs of
three; none on an AVX-512 Xeon, none with oneDNN disabled), so `channels_last_applies` keeps
NCHW there, with one logged line.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import dataclass

import torch

from relif_ray.errors import UserError, first_line

LOGGER = logging.getLogger(__name__)

MINIMUM_DRIVER: dict[int, tuple[int, ...]] = {
    11: (450, 80, 2),
    12: (525, 60, 13),
    13: (580, 65, 6),
}
"""The oldest Linux x86_64 NVIDIA driver that runs any CUDA runtime of each major release
(minor version compatibility: a runtime of one major release runs on every driver of that
release's branch and newer): NVIDIA's CUDA Compatibility guide, table "CUDA Toolkit 11.x,
12.x, and 13.x Driver Version Ranges" (>= 450, >= 525, >= 580), each at its first driver
there (450.80.02, the one the guide names for 11.x; 525.60.13 and 580.65.06, the drivers of
CUDA 12.0 and 13.0). torch's CUDA wheels carry their own runtime and the machine code of
every GPU they support, so they need no newer driver for the runtime's JIT."""

NATIVE_BF16_CAPABILITY = (8, 0)
"""The first compute capability with bf16 tensor-core arithmetic (Ampere: A100, A10, RTX 30)."""


@dataclass(frozen=True)
class GpuStack:
    """One machine's GPU stack: `driver`, the NVIDIA driver version ("580.65.06"; None when
    `nvidia-smi` gave none, and `problem` says why); `cuda_runtime`, the CUDA version torch was
    built with ("13.0"; None for a CPU build); `torch`, torch's version; `gpus`, each GPU as
    (model, compute capability "9.0")."""

    driver: str | None
    cuda_runtime: str | None
    torch: str
    gpus: tuple[tuple[str, str], ...] = ()
    problem: str | None = None


def query_gpu_stack() -> GpuStack:
    """This machine's GPU stack (see `GpuStack`): runs `nvidia-smi`, creates no CUDA context."""
    runtime, version = torch.version.cuda, torch.__version__
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return GpuStack(None, runtime, version, problem="no nvidia-smi on PATH")
    query = ["--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"]
    try:
        done = subprocess.run([smi, *query], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return GpuStack(None, runtime, version, problem=f"nvidia-smi failed: {error}")
    rows = [[field.strip() for field in line.split(",")] for line in done.stdout.splitlines()]
    rows = [row for row in rows if len(row) == 3]
    if done.returncode != 0 or not rows:
        reason = first_line(done.stderr or done.stdout, f"exit status {done.returncode}")
        return GpuStack(None, runtime, version, problem=f"nvidia-smi: {reason}")
    return GpuStack(
        driver=rows[0][1],
        cuda_runtime=runtime,
        torch=version,
        gpus=tuple((name, capability) for name, _, capability in rows),
    )


def version_numbers(text: str) -> tuple[int, ...]:
    """The leading numeric fields of a version: "580.65.06" -> (580, 65, 6)."""
    numbers = []
    for field in text.split("."):
        if not field.isdigit():
            break
        numbers.append(int(field))
    return tuple(numbers)


def minimum_driver(cuda_runtime: str) -> tuple[int, ...] | None:
    """The oldest driver the CUDA runtime `cuda_runtime` ("13.0") runs on (`MINIMUM_DRIVER`,
    by its major release), None for a major release the table does not know."""
    major = (version_numbers(cuda_runtime) + (0,))[0]
    return MINIMUM_DRIVER.get(major)


def shown(version: tuple[int, ...]) -> str:
    """(580, 65, 6) -> "580.65.06", as NVIDIA writes driver versions."""
    return ".".join([str(version[0]), *(f"{part:02d}" for part in version[1:])])


def check_driver(stack: GpuStack, where: str) -> None:
    """A one-line `UserError` when `stack`'s driver is older than its CUDA runtime needs;
    nothing to check without a driver version or a CUDA build of torch."""
    if stack.driver is None or stack.cuda_runtime is None:
        return
    needed = minimum_driver(stack.cuda_runtime)
    if needed is not None and version_numbers(stack.driver) < needed:
        raise UserError(
            f"{where}: NVIDIA driver {stack.driver} is older than {shown(needed)}, the oldest "
            f"that torch {stack.torch}'s CUDA {stack.cuda_runtime} runtime runs on; update the "
            "driver there, or install a torch built for an older CUDA"
        )


def has_native_bf16(capability: str) -> bool:
    """Whether a GPU of compute capability `capability` ("7.0") computes bf16 natively."""
    return (version_numbers(capability) + (0, 0))[:2] >= NATIVE_BF16_CAPABILITY


def describe(stack: GpuStack) -> str:
    """The stack as one line of the sweep's preflight: driver, CUDA runtime, each GPU model
    with its compute capability and the precision a bf16 forward runs in there."""
    runtime = f"CUDA {stack.cuda_runtime}" if stack.cuda_runtime else "no CUDA (a CPU build)"
    torch_part = f"torch {stack.torch} ({runtime})"
    if stack.driver is None:
        return f"no NVIDIA driver found ({stack.problem}); {torch_part}"
    counted: dict[tuple[str, str], int] = {}
    for gpu in stack.gpus:
        counted[gpu] = counted.get(gpu, 0) + 1
    gpus = ", ".join(
        f"{count} x {name} (compute {capability}, "
        f"{'bf16' if has_native_bf16(capability) else 'fp32: no native bf16'})"
        for (name, capability), count in counted.items()
    )
    return f"NVIDIA driver {stack.driver}, {torch_part}, {gpus}"


def native_bf16(device: torch.device) -> bool:
    """Whether the CUDA `device` computes bf16 natively (not emulated):
    `torch.cuda.is_bf16_supported(including_emulation=False)`, or its compute capability where
    that argument does not exist."""
    with torch.cuda.device(device):
        try:
            return torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:
            return torch.cuda.get_device_capability(device) >= NATIVE_BF16_CAPABILITY


def channels_last_applies(channels_last: bool, device: torch.device) -> bool:
    """Whether the model and its images go channels-last: `channels_last` (train.channels_last),
    except on a CPU whose convolutions run in oneDNN without AVX-512 (torch's CPU capability
    below AVX512), where channels-last corrupts the heap (the module docstring) and the run
    keeps NCHW (logged once, with the reason)."""
    if not channels_last or device.type != "cpu":
        return channels_last
    if not torch.backends.mkldnn.is_available() or not torch.backends.mkldnn.enabled:
        return True
    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("AVX512"):
        return True
    LOGGER.info(
        "train.channels_last: this CPU runs oneDNN convolutions at %s, where channels-last "
        "backward corrupts the heap in torch %s; the model stays NCHW",
        capability,
        torch.__version__,
    )
    return False


def forward_precision(precision: str, device: torch.device) -> str:
    """The precision the model forward runs in: `precision` (train.precision), except bf16 on
    a CUDA GPU without native bf16, which runs fp32 (logged once, with the reason)."""
    if precision != "bf16" or device.type != "cuda" or native_bf16(device):
        return precision
    major, minor = torch.cuda.get_device_capability(device)
    LOGGER.info(
        "train.precision bf16: %s (compute capability %d.%d) has no native bf16 (compute "
        "capability 8.0 and newer have it); the model forward runs fp32",
        torch.cuda.get_device_name(device),
        major,
        minor,
    )
    return "fp32"
