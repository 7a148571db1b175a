"""ATen calls of one ReLiF regularizer step (forward + backward): a count, not a time.

On a GPU every ATen call costs host time, and a training step whose host work outlasts its
GPU work leaves the GPU idle. Two counts of one warm step: its ATen calls, with torch.profiler
(every `aten::` event, nested ones included: dispatch work, on the CPU), and the kernel launches
it would make on a GPU (`device_kernels`: the operations on device tensors, views excluded;
converting a Python number for an operation is an ATen call on the host, not a launch). Both
are deterministic for a given torch version, so `tests/test_benchmarks.py` holds both to upper
bounds (`LIMIT`, `KERNEL_LIMIT`): the win cannot silently regress.

    python benchmarks/relif_op_count.py     # both settings, against the count before the rewrite
    python benchmarks/relif_op_count.py --against ../main   # host time against another checkout
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from timing import ratio_with_interval
from torch.profiler import ProfilerActivity, profile
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from relif_ray.config import ReLiFConfig
from relif_ray.relif.regularizer import ReLiFRegularizer


@dataclass(frozen=True)
class Setting:
    """One regularizer call's shape: tasks (those in `squashed` have unbounded scores), batch
    size and representation width."""

    name: str
    tasks: tuple[str, ...]
    squashed: tuple[str, ...]
    batch_size: int
    width: int


NYUV2 = Setting("NYUv2", ("seg", "depth", "normal"), ("depth", "normal"), 8, 2048)
"""ResNet-50's pooled representation, batch 8, depth and normal squashed with the ERM band."""
CLINICAL = Setting(
    "clinical", ("mortality", "decompensation", "length_of_stay", "phenotype"), (), 64, 256
)
"""The clinical LSTM's representation (hidden 256), batch 64, four probability scores."""
SETTINGS = (NYUV2, CLINICAL)

BEFORE = {"NYUv2": 971, "clinical": 975}
"""The regularizer's ATen calls before issue 29's rewrite (commit 024f0cd; torch 2.14.1)."""
KERNELS_BEFORE = {"NYUv2": 297, "clinical": 297}
"""Its device kernel launches then (`device_kernels`)."""
LIMIT = {"NYUv2": 610, "clinical": 530}
"""Upper bounds on the ATen calls now (602 and 524 with torch 2.14.1): the benchmark's target
and the bound `tests/test_benchmarks.py` holds the regularizer to."""
KERNEL_LIMIT = {"NYUv2": 240, "clinical": 210}
"""Upper bounds on the device kernel launches now (238 and 209), likewise."""


Inputs = tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], torch.Tensor]


def regularizer_steps(  # noqa: ANN201
    setting: Setting, device: torch.device | None = None, seed: int = 0
):
    """(inputs, step): `inputs()` draws a fresh random batch of scores, masks and
    representation (on `device`, default the CPU); `step(batch)` runs the regularizer's
    forward + backward on it."""
    device = device or torch.device("cpu")
    constants = {task: [0.0, 10.0] for task in setting.squashed}
    config = ReLiFConfig(enabled=True, warmup_steps=0, squash_constants=constants)
    regularizer = ReLiFRegularizer(config, list(setting.tasks)).to(device)
    generator = torch.Generator().manual_seed(seed)
    is_probability = {task: task not in setting.squashed for task in setting.tasks}

    def inputs() -> Inputs:
        scores = {}
        for task in setting.tasks:
            scale = 10.0 if task in setting.squashed else 1.0
            score = torch.rand(setting.batch_size, generator=generator) * scale
            valid = torch.rand(setting.batch_size, generator=generator) > 0.2
            scores[task] = (score.to(device).requires_grad_(), valid.to(device))
        shape = (setting.batch_size, setting.width)
        representation = torch.randn(shape, generator=generator).to(device)
        return scores, representation.requires_grad_()

    def step(batch: Inputs) -> None:
        loss, _ = regularizer(*batch, is_probability)
        loss.backward()

    return inputs, step


@contextlib.contextmanager
def cuda_like_algorithms() -> Iterator[None]:
    """Deterministic algorithms off, as in a CUDA run, whatever the process set before (the
    engine turns them on for CPU runs, and on the CPU they take other ATen paths: 836 calls
    rather than 602 for NYUv2)."""
    previous = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=warn_only)


def aten_calls(setting: Setting, warm_steps: int = 3) -> int:
    """ATen calls (nested ones included) of one warm forward + backward."""
    inputs, step = regularizer_steps(setting)
    with cuda_like_algorithms():
        for _ in range(warm_steps):  # scales, controller and the cached constants are set
            step(inputs())
        batch = inputs()
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            step(batch)
    return sum(1 for event in profiler.events() if event.name.startswith("aten::"))


class _DeviceKernels(TorchDispatchMode):
    """Counts the operations that reach the device's kernels: those that make or write a
    tensor on it, views excluded (each would be a kernel launch on a GPU)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device, self.count = device, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        result = func(*args, **(kwargs or {}))
        outputs = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
        if not func.is_view and any(t.device == self.device for t in outputs):
            self.count += 1
        return result


def device_kernels(setting: Setting, warm_steps: int = 3) -> int:
    """Kernel launches of one warm forward + backward on a GPU, counted without one: the
    regularizer runs on PyTorch's "meta" device (shapes only), and every operation that makes
    or writes a meta tensor, views excluded, is one launch. (ATen calls on host numbers, such
    as converting a Python number for an operation, launch nothing.)"""
    meta = torch.device("meta")
    inputs, step = regularizer_steps(setting, meta)
    with cuda_like_algorithms():
        for _ in range(warm_steps):
            step(inputs())
        batch = inputs()
        with _DeviceKernels(meta) as kernels:
            step(batch)
    return kernels.count


def host_seconds(setting: Setting, steps: int = 200) -> float:
    """Median seconds of one forward + backward on the CPU: its host work (on a GPU the part
    that can leave the GPU idle) and the CPU's compute on these small tensors."""
    inputs, step = regularizer_steps(setting)
    times = []
    for index in range(steps + 3):
        batch = inputs()
        start = time.perf_counter()
        step(batch)
        if index >= 3:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def compare(against: Path, rounds: int) -> None:
    """Host time of this checkout's regularizer against another checkout's (`against`, e.g.
    the main branch before a change), in one run: each round times both, in a shuffled order,
    each in a fresh process with its checkout first on the path; the ratio (this / against)
    is the median over rounds of the per-round ratios, with its ~95% interval."""
    trees = {"this": Path(__file__).resolve().parents[1], "against": against.resolve()}
    shuffler = random.Random(0)
    for setting in SETTINGS:
        times: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(rounds):
            for name in shuffler.sample(list(trees), k=2):
                times[name].append(_host_seconds_in(trees[name], setting))
        ratio, lower, upper = ratio_with_interval(times, "this", "against")
        print(
            f"{setting.name}: {1e3 * statistics.median(times['this']):.3f} ms against "
            f"{1e3 * statistics.median(times['against']):.3f} ms of CPU per forward + backward; "
            f"ratio {ratio:.3f} [{lower:.3f}, {upper:.3f}] over {rounds} rounds"
        )


def _host_seconds_in(tree: Path, setting: Setting) -> float:
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, __file__, "--host-seconds", setting.name]
    output = subprocess.run(command, env=environment, capture_output=True, text=True, check=True)
    return float(output.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--against", type=Path, help="another checkout: host time of both, ratio in one run"
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds of --against")
    parser.add_argument("--host-seconds", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.host_seconds:
        print(host_seconds(next(s for s in SETTINGS if s.name == args.host_seconds)))
        return
    if args.against:
        compare(args.against, args.rounds)
        return
    for setting in SETTINGS:
        count, kernels = aten_calls(setting), device_kernels(setting)
        before, kernels_before = BEFORE[setting.name], KERNELS_BEFORE[setting.name]
        print(
            f"{setting.name}: {count} ATen calls per forward + backward ({before} before the "
            f"rewrite), {kernels} device kernel launches ({kernels_before} before); "
            f"{1e3 * host_seconds(setting):.2f} ms of CPU"
        )


if __name__ == "__main__":
    main()
