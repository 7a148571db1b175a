"""Step time of every multi-task architecture against LibMTL 1.1.5's same architecture.

One process, NYUv2-shaped synthetic data, one batch. For each architecture
(`relif_ray.models.architectures`) our dense model (the architecture's trunk + the simple heads)
and LibMTL's architecture class of the same name built on that model's own encoders
(`relif_ray.testing.libmtl_reference.libmtl_architecture`: the very same modules, so the
same weights and work)
with our heads as its decoders (each resized to the image as ours is). One step of each is:
forward, the three NYUv2 task losses (normals L2-normalized on LibMTL's side, as our model
does in its forward), their sum (plus DSelect-k's regularizer on our side; LibMTL's forward
backpropagates its own), backward, an SGD step with learning rate 0. Steps are interleaved
round by round (`timing.interleaved_times`); the row is the median per-round ratio ours /
LibMTL's with its ~95% interval, target at most 1.0. Peak memory per trial is measured by
`run.py`'s architectures section, one `trial_worker.py` process per architecture.

    python benchmarks/architectures_step_time.py --quick      # tiny sizes, one CPU thread
    python benchmarks/architectures_step_time.py --architectures mtan,mmoe --rounds 40
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from timing import Step, interleaved_times, ratio_with_interval, verdict_at_most
from torch import Tensor, nn

from relif_ray.config import DataConfig, ModelConfig
from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
from relif_ray.models.architectures import ARCHITECTURES, RESNET, build_dense_model
from relif_ray.problems import load_problem
from relif_ray.tasks.base import Batch
from relif_ray.testing.libmtl_reference import LIBMTL_NAMES, libmtl_architecture
from relif_ray.transfer import move_batch

TARGET = 1.0
QUICK_OPTIONS = {
    "mmoe": {"num_experts": 2},
    "cgc": {"num_experts": 1, "task_experts": 1},
    "ple": {"num_experts": 1, "task_experts": 1},
    "dselect_k": {"num_experts": 2, "num_nonzeros": 1},
}
"""Expert counts of `--quick` (each expert is a whole encoder); otherwise the defaults."""


class ResizedHead(nn.Module):
    """One of our heads as LibMTL's decoder: its prediction, resized to the image as ours is."""

    def __init__(self, head: nn.Module, size: tuple[int, int]) -> None:
        super().__init__()
        self.head, self.size = head, size

    def forward(self, features: Tensor) -> Tensor:
        prediction = self.head(features)[0]
        return F.interpolate(
            prediction, self.size, mode="bilinear", align_corners=self.head.align_corners
        )


@dataclass
class ArchitectureTiming:
    """Our median step time, LibMTL's, and ours / LibMTL's with its ~95% interval."""

    ms_per_step: float
    libmtl_ms_per_step: float
    ratio: tuple[float, float, float]
    verdict: str


def sgd_step(model: nn.Module, loss_of: callable) -> Step:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_of().backward()
        optimizer.step()

    return step


def steps_of(name: str, problem, config: ModelConfig, batch: Batch, device) -> dict[str, Step]:
    """Our step and LibMTL's of architecture `name` on `batch`."""
    image = batch["input"]
    torch.manual_seed(0)
    model = build_dense_model(config, tuple(image.shape[1:])).to(device).train()
    decoders = {task: ResizedHead(head, image.shape[-2:]) for task, head in model.heads.items()}
    theirs = libmtl_architecture(model, decoders, tuple(image.shape[1:])).to(device).train()
    if name == "dselect_k":
        theirs._binary_codes = model.trunk.codes[None]  # LibMTL's are all ones under NumPy 2

    def losses(predictions: dict[str, Tensor]) -> Tensor:
        return sum(task.loss(predictions[task.name], batch[task.name]) for task in problem.tasks)

    def ours() -> Tensor:
        output = model(batch)
        extra = output.auxiliary_loss
        return losses(output.predictions) + (extra if extra is not None else 0.0)

    def libmtl() -> Tensor:
        predictions = theirs(image)
        predictions["normal"] = F.normalize(predictions["normal"], dim=1)
        return losses(predictions)

    return {name: sgd_step(model, ours), f"libmtl-{name}": sgd_step(theirs, libmtl)}


def measure(
    device: str = "cpu",
    quick: bool = False,
    rounds: int | None = None,
    batch_size: int | None = None,
    height: int | None = None,
    width: int | None = None,
    backbone: str = "resnet18",
    architectures: Sequence[str] | None = None,
) -> tuple[str, dict[str, ArchitectureTiming]]:
    """Time each architecture (default: all of NYUv2's) against LibMTL's, interleaved."""
    names = list(architectures or (n for n, a in ARCHITECTURES.items() if RESNET in a.encoders))
    rounds = rounds or (5 if quick else 30)
    batch_size = batch_size or (2 if quick else 8)
    height, width = height or (32 if quick else 64), width or (40 if quick else 80)
    with tempfile.TemporaryDirectory() as tmp:
        root = write_synthetic_nyuv2(
            Path(tmp) / "nyuv2", train=batch_size, val=1, height=height, width=width, seed=0
        )
        problem = load_problem(DataConfig(dataset="nyuv2", root=str(root)))
    batch = move_batch(
        problem.splits["train"].batch(torch.arange(batch_size)), torch.device(device)
    )
    steps: dict[str, Step] = {}
    for name in names:
        options = QUICK_OPTIONS.get(name, {}) if quick else {}
        config = ModelConfig(
            backbone=backbone, head_channels=16, architecture=name, architecture_options=options
        )
        steps.update(steps_of(name, problem, config, batch, torch.device(device)))
    times = interleaved_times(steps, rounds, warmup=2, cuda=device.startswith("cuda"))
    timings = {}
    for name in names:
        median, lower, upper = ratio_with_interval(times, name, f"libmtl-{name}")
        timings[name] = ArchitectureTiming(
            1e3 * statistics.median(times[name]),
            1e3 * statistics.median(times[f"libmtl-{name}"]),
            (median, lower, upper),
            verdict_at_most(median, lower, TARGET),
        )
    description = (
        f"{backbone}, simple heads of 16 channels, batch {batch_size}x3x{height}x{width}, "
        f"{'the fewest experts' if quick else 'default expert counts'}, median of {rounds} "
        "interleaved rounds"
    )
    return description, timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few rounds")
    parser.add_argument("--architectures", help="comma-separated names (default: NYUv2's)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = args.architectures.split(",") if args.architectures else None
    description, timings = measure(
        args.device, args.quick, args.rounds, args.batch_size, args.height, args.width,
        args.backbone, names,
    )  # fmt: skip
    print(f"torch {torch.__version__} on {args.device}; {description}")
    print(f"{'architecture':<14}{'ms/step':>9}{'LibMTL':>9}   {'ours / LibMTL [95% CI]':>24}")
    for name, timing in timings.items():
        median, lower, upper = timing.ratio
        interval = f"{median:.2f} [{lower:.2f}, {upper:.2f}]"
        print(
            f"{name:<14}{timing.ms_per_step:>9.1f}{timing.libmtl_ms_per_step:>9.1f}   "
            f"{interval:>24}  <= {TARGET}  {timing.verdict} ({LIBMTL_NAMES[name]})"
        )
    return 0 if all(t.verdict != "FAIL" for t in timings.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
