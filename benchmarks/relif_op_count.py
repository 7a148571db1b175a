"""ATen calls of one ReLiF regularizer step (forward + backward): a count, not a time.

On a GPU every ATen call costs host time (dispatch, and for most a kernel launch), and a
training step whose host work outlasts its GPU work leaves the GPU idle. The regularizer's
calls are counted with torch.profiler (every `aten::` event, nested ones included) on one warm
step, on the CPU. The count is deterministic for a given torch version, so
`tests/test_benchmarks.py` holds it to an upper bound (`LIMIT`): the win cannot silently
regress.

    python benchmarks/relif_op_count.py     # both settings, against the count before the rewrite
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

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
"""The counts of the regularizer before issue 29's rewrite (commit 024f0cd; torch 2.14.1, CPU),
for the benchmark's ratio."""
LIMIT = {"NYUv2": 620, "clinical": 540}
"""Upper bounds on the counts now (609 and 531 with torch 2.14.1): the benchmark's target and
the bound `tests/test_benchmarks.py` holds the regularizer to."""


Inputs = tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], torch.Tensor]


def regularizer_steps(setting: Setting, seed: int = 0):  # noqa: ANN201
    """(inputs, step): `inputs()` draws a fresh random batch of scores, masks and
    representation; `step(batch)` runs the regularizer's forward + backward on it."""
    constants = {task: [0.0, 10.0] for task in setting.squashed}
    config = ReLiFConfig(enabled=True, warmup_steps=0, squash_constants=constants)
    regularizer = ReLiFRegularizer(config, list(setting.tasks))
    generator = torch.Generator().manual_seed(seed)
    is_probability = {task: task not in setting.squashed for task in setting.tasks}

    def inputs() -> Inputs:
        scores = {}
        for task in setting.tasks:
            scale = 10.0 if task in setting.squashed else 1.0
            score = torch.rand(setting.batch_size, generator=generator) * scale
            valid = torch.rand(setting.batch_size, generator=generator) > 0.2
            scores[task] = (score.requires_grad_(), valid)
        shape = (setting.batch_size, setting.width)
        return scores, torch.randn(shape, generator=generator).requires_grad_()

    def step(batch: Inputs) -> None:
        loss, _ = regularizer(*batch, is_probability)
        loss.backward()

    return inputs, step


def aten_calls(setting: Setting, warm_steps: int = 3) -> int:
    """ATen calls (nested ones included) of one warm forward + backward."""
    inputs, step = regularizer_steps(setting)
    for _ in range(warm_steps):  # scales, controller and the cached constants are set
        step(inputs())
    batch = inputs()
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        step(batch)
    return sum(1 for event in profiler.events() if event.name.startswith("aten::"))


def host_seconds(setting: Setting, steps: int = 200) -> float:
    """Median seconds of one forward + backward on the CPU (host time; informative only)."""
    inputs, step = regularizer_steps(setting)
    times = []
    for index in range(steps + 3):
        batch = inputs()
        start = time.perf_counter()
        step(batch)
        if index >= 3:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for setting in SETTINGS:
        count = aten_calls(setting)
        before = BEFORE[setting.name]
        print(
            f"{setting.name}: {count} ATen calls per forward + backward ({before / count:.2f}x "
            f"fewer than the {before} before the rewrite); "
            f"{1e3 * host_seconds(setting):.2f} ms of CPU"
        )


if __name__ == "__main__":
    main()
