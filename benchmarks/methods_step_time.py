"""Step time of every MTL method relative to ERM, and side by side with TorchJD.

One process, one small dense-prediction model (a strided conv backbone with segmentation,
depth and surface-normal heads, like NYUv2's three tasks), one fixed batch. All variants share
that one model instance (so memory placement cannot favour any of them) and each has its own
SGD optimizer with learning rate 0 (the step runs at full cost but the parameters stay fixed,
so every variant is timed at the same point); a step is zero_grad -> forward -> task losses ->
backward (the method's, or TorchJD's) -> optimizer step. The variants are timed
interleaved, one step each per round in a shuffled order, so machine noise hits all of them
alike; each ratio is the median over rounds of the per-round ratio.

TorchJD has PCGrad and FairGrad as aggregators (run through `torchjd.autojac.mtl_backward` on
the backbone's feature map + `jac_to_grad`) and Uncertainty weighting as the `UW` scalarizer;
for those the table compares our method with TorchJD's (target: ratio <= 1.0).

    python benchmarks/methods_step_time.py --quick     # < 1 minute on a laptop CPU
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchjd.aggregation import FairGrad as JDFairGrad
from torchjd.aggregation import PCGrad as JDPCGrad
from torchjd.autojac import jac_to_grad, mtl_backward
from torchjd.scalarization import UW

from relif_ray.methods import StepContext, build_method

TASKS = ["segmentation", "depth", "normal"]
NUM_CLASSES = 13
OURS = ["erm", "uncertainty", "gradnorm", "pcgrad", "fairgrad"]
TORCHJD_COUNTERPART = {"pcgrad": "torchjd-pcgrad", "fairgrad": "torchjd-fairgrad",
                       "uncertainty": "torchjd-uw"}
FAIRGRAD_ALPHA = 2.0


class DenseModel(nn.Module):
    """Strided conv backbone (last conv = last shared layer) + three 1x1-conv dense heads."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.ReLU(),
        )
        channels = {"segmentation": NUM_CLASSES, "depth": 1, "normal": 3}
        self.heads = nn.ModuleDict({
            task: nn.Sequential(nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.ReLU(),
                                nn.Conv2d(2 * width, out, 1))
            for task, out in channels.items()
        })

    def shared_parameters(self) -> list[nn.Parameter]:
        return list(self.backbone.parameters())

    def last_shared_parameters(self) -> list[nn.Parameter]:
        return list(self.backbone[-2].parameters())

    def forward(self, images: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        features = self.backbone(images)
        size = images.shape[-2:]
        predictions = {
            task: F.interpolate(head(features), size=size, mode="bilinear", align_corners=False)
            for task, head in self.heads.items()
        }
        return features, predictions


def task_losses(predictions: dict[str, Tensor], batch: dict[str, Tensor]) -> dict[str, Tensor]:
    normal = F.normalize(predictions["normal"], dim=1)
    return {
        "segmentation": F.cross_entropy(predictions["segmentation"], batch["segmentation"]),
        "depth": (predictions["depth"] - batch["depth"]).abs().mean(),
        "normal": 1 - (normal * batch["normal"]).sum(dim=1).mean(),
    }


def synthetic_batch(batch_size: int, height: int, width: int) -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(0)
    shape = (batch_size, height, width)
    normals = torch.randn(batch_size, 3, height, width, generator=generator)
    return {
        "images": torch.randn(batch_size, 3, height, width, generator=generator),
        "segmentation": torch.randint(0, NUM_CLASSES, shape, generator=generator),
        "depth": torch.rand(batch_size, 1, height, width, generator=generator),
        "normal": F.normalize(normals, dim=1),
    }


def our_step(name: str, model: DenseModel) -> Callable[[dict[str, Tensor]], None]:
    device = next(model.parameters()).device
    options = {"alpha": FAIRGRAD_ALPHA} if name == "fairgrad" else {}
    method = build_method(name, TASKS, seed=0, **options).to(device)
    optimizer = torch.optim.SGD([*model.parameters(), *method.parameters()], lr=0.0)
    counter = iter(range(10**9))
    shared, last_shared = model.shared_parameters(), model.last_shared_parameters()

    def step(batch: dict[str, Tensor]) -> None:
        optimizer.zero_grad(set_to_none=True)
        _, predictions = model(batch["images"])
        ctx = StepContext(shared, last_shared, next(counter))
        method.backward(task_losses(predictions, batch), ctx, None)
        optimizer.step()

    return step


def torchjd_step(name: str, model: DenseModel) -> Callable[[dict[str, Tensor]], None]:
    if name == "torchjd-uw":
        scalarizer = UW(len(TASKS)).to(next(model.parameters()).device)
        optimizer = torch.optim.SGD([*model.parameters(), *scalarizer.parameters()], lr=0.0)

        def uw_step(batch: dict[str, Tensor]) -> None:
            optimizer.zero_grad(set_to_none=True)
            _, predictions = model(batch["images"])
            losses = task_losses(predictions, batch)
            scalarizer(torch.stack([losses[t] for t in TASKS])).backward()
            optimizer.step()

        return uw_step

    aggregator = JDPCGrad() if name == "torchjd-pcgrad" else JDFairGrad(alpha=FAIRGRAD_ALPHA)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    shared = model.shared_parameters()
    heads = [list(model.heads[t].parameters()) for t in TASKS]

    def jd_step(batch: dict[str, Tensor]) -> None:
        optimizer.zero_grad(set_to_none=True)
        features, predictions = model(batch["images"])
        losses = task_losses(predictions, batch)
        mtl_backward([losses[t] for t in TASKS], features=features, tasks_params=heads,
                     shared_params=shared)
        jac_to_grad(shared, aggregator)
        optimizer.step()

    return jd_step


def measure(
    steps: dict[str, Callable], batch: dict[str, Tensor], rounds: int, warmup: int
) -> dict[str, list[float]]:
    """Per-variant list of step times (s), interleaved in a shuffled order each round."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    shuffler = random.Random(0)
    synchronize = torch.cuda.synchronize if batch["images"].is_cuda else (lambda: None)
    for round_index in range(warmup + rounds):
        order = list(steps)
        shuffler.shuffle(order)
        for name in order:
            synchronize()
            start = time.perf_counter()
            steps[name](batch)
            synchronize()
            elapsed = time.perf_counter() - start
            if round_index >= warmup:
                times[name].append(elapsed)
    return times


def ratio_with_interval(
    times: dict[str, list[float]], name: str, reference: str
) -> tuple[float, float, float]:
    """Median of the per-round ratios and its ~95% distribution-free confidence interval.

    The interval is between the order statistics n/2 -+ 0.98 sqrt(n) of the sorted ratios
    (the binomial sign-test interval for a median).
    """
    ratios = sorted(a / b for a, b in zip(times[name], times[reference], strict=True))
    n = len(ratios)
    k = max(0, math.floor(n / 2 - 0.98 * math.sqrt(n)))
    return statistics.median(ratios), ratios[k], ratios[n - 1 - k]


def verdict(median: float, lower: float) -> str:
    """pass: median <= 1; within noise: median > 1 but 1 is inside the interval; else FAIL."""
    if median <= 1.0:
        return "pass"
    return "within noise" if lower <= 1.0 else "FAIL"


def report(times: dict[str, list[float]]) -> bool:
    """Print the table; False when some method is measurably slower than TorchJD's."""
    header = f"{'variant':<18}{'ms/step':>9}{'vs erm':>8}   {'vs torchjd [95% CI]':>22}"
    print(f"{header}  target  result")
    all_pass = True
    for name in times:
        line = f"{name:<18}{1e3 * statistics.median(times[name]):>9.2f}"
        line += f"{ratio_with_interval(times, name, 'erm')[0]:>8.2f}"
        if name in TORCHJD_COUNTERPART:
            median, lower, upper = ratio_with_interval(times, name, TORCHJD_COUNTERPART[name])
            result = verdict(median, lower)
            all_pass &= result != "FAIL"
            interval = f"{median:.2f} [{lower:.2f}, {upper:.2f}]"
            line += f"   {interval:>22}  <= 1.0  {result}"
        print(line)
    return all_pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds (< 1 min)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--channels", type=int, default=None, help="backbone base width")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1 is least disturbed by other processes)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rounds = args.rounds or (15 if args.quick else 60)
    height = args.height or (32 if args.quick else 64)
    width = args.width or (40 if args.quick else 80)
    channels = args.channels or (16 if args.quick else 32)

    device = torch.device(args.device)
    batch = {k: v.to(device) for k, v in synthetic_batch(args.batch_size, height, width).items()}
    torch.manual_seed(0)
    model = DenseModel(channels).to(device)
    steps = {name: our_step(name, model) for name in OURS}
    steps.update({name: torchjd_step(name, model) for name in TORCHJD_COUNTERPART.values()})
    print(f"torch {torch.__version__} on {device}, {torch.get_num_threads()} CPU threads; batch "
          f"{args.batch_size}x3x{height}x{width}, width {channels}; {rounds} rounds (median)")
    return 0 if report(measure(steps, batch, rounds, warmup=3)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
