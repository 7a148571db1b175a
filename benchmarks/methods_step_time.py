"""Step time of every MTL method relative to ERM, and side by side with TorchJD.

One process, the project's NYUv2 dense model (`DenseMTLModel`: ResNet encoder at output
stride 8, seg/depth/normal heads) with a small backbone, the project's NYUv2 task losses, and
one fixed batch of synthetic NYUv2 (written by `write_synthetic_nyuv2` to a temporary
directory). All variants share that one model instance (so memory placement cannot favour any
of them) and each has its own SGD optimizer with learning rate 0 (the step runs at full cost
but the parameters stay fixed, so every variant is timed at the same point). A step is
zero_grad -> forward -> task losses -> backward (the method's, or TorchJD's) -> optimizer
step. The variants are timed interleaved, one step each per round in a shuffled order, so
machine noise hits all of them alike; each ratio is the median over rounds of the per-round
ratio, with a ~95% distribution-free confidence interval.

TorchJD has PCGrad and FairGrad as aggregators, run through `torchjd.autojac.mtl_backward`
(features: the encoder's output map, the heads' input) + `jac_to_grad`, and Uncertainty
weighting as the `UW` scalarizer; for those the table compares our method with TorchJD's
(target: ratio <= 1.0). ERM+ReLiF is not timed here (see the ReLiF benchmarks).

    python benchmarks/methods_step_time.py --quick     # < 1 minute on one CPU thread
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor
from torchjd.aggregation import FairGrad as JDFairGrad
from torchjd.aggregation import PCGrad as JDPCGrad
from torchjd.autojac import jac_to_grad, mtl_backward
from torchjd.scalarization import UW

from relif_ray.config import DataConfig, ModelConfig
from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
from relif_ray.methods import StepContext, build_method
from relif_ray.problem import Problem, load_problem, move_batch
from relif_ray.tasks.base import Batch

OURS = ["erm", "uncertainty", "gradnorm", "pcgrad", "fairgrad"]
TORCHJD_COUNTERPART = {
    "pcgrad": "torchjd-pcgrad",
    "fairgrad": "torchjd-fairgrad",
    "uncertainty": "torchjd-uw",
}
FAIRGRAD_ALPHA = 2.0
Step = Callable[[], None]


class Setup:
    """The shared model, its tasks and one batch on the device."""

    def __init__(self, problem: Problem, model_config: ModelConfig, batch_size: int, device):
        torch.manual_seed(0)
        self.tasks = problem.tasks
        self.task_names = problem.task_names
        self.model = problem.build_model(model_config).to(device)
        self.model.train()
        index = torch.arange(batch_size)
        self.batch: Batch = move_batch(problem.splits["train"].batch(index), device)
        self.encoded: list[Tensor] = []
        self.model.encoder.register_forward_hook(lambda _m, _i, out: self.encoded.append(out))

    def losses(self) -> dict[str, Tensor]:
        """Forward and task losses; the encoder output is left in `self.encoded[-1]`."""
        self.encoded.clear()
        output = self.model(self.batch)
        return {
            task.name: task.loss(output.predictions[task.name], self.batch[task.name])
            for task in self.tasks
        }


def our_step(name: str, setup: Setup) -> Step:
    model = setup.model
    options = {"alpha": FAIRGRAD_ALPHA} if name == "fairgrad" else {}
    device = next(model.parameters()).device
    method = build_method(name, setup.task_names, seed=0, **options).to(device)
    optimizer = torch.optim.SGD([*model.parameters(), *method.parameters()], lr=0.0)
    shared, last_shared = model.shared_parameters(), model.last_shared_parameters()
    counter = iter(range(10**9))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        losses = setup.losses()
        method.backward(losses, StepContext(shared, last_shared, next(counter)), None)
        optimizer.step()

    return step


def torchjd_step(name: str, setup: Setup) -> Step:
    model = setup.model
    if name == "torchjd-uw":
        scalarizer = UW(len(setup.task_names)).to(next(model.parameters()).device)
        optimizer = torch.optim.SGD([*model.parameters(), *scalarizer.parameters()], lr=0.0)

        def uw_step() -> None:
            optimizer.zero_grad(set_to_none=True)
            losses = setup.losses()
            scalarizer(torch.stack([losses[t] for t in setup.task_names])).backward()
            optimizer.step()

        return uw_step

    aggregator = JDPCGrad() if name == "torchjd-pcgrad" else JDFairGrad(alpha=FAIRGRAD_ALPHA)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    shared = model.shared_parameters()
    heads = [list(model.heads[t].parameters()) for t in setup.task_names]

    def jd_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        losses = setup.losses()
        mtl_backward(
            [losses[t] for t in setup.task_names],
            features=setup.encoded[-1],
            tasks_params=heads,
            shared_params=shared,
        )
        jac_to_grad(shared, aggregator)
        optimizer.step()

    return jd_step


def measure(steps: dict[str, Step], rounds: int, warmup: int, cuda: bool) -> dict[str, list]:
    """Per-variant list of step times (s), interleaved in a shuffled order each round."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    shuffler = random.Random(0)
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    for round_index in range(warmup + rounds):
        order = list(steps)
        shuffler.shuffle(order)
        for name in order:
            synchronize()
            start = time.perf_counter()
            steps[name]()
            synchronize()
            if round_index >= warmup:
                times[name].append(time.perf_counter() - start)
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
        line = f"{name:<18}{1e3 * statistics.median(times[name]):>9.1f}"
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
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--head-channels", type=int, default=None)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (1 is least disturbed by other processes)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rounds = args.rounds or (10 if args.quick else 40)
    batch_size = args.batch_size or (4 if args.quick else 8)
    height = args.height or (32 if args.quick else 64)
    width = args.width or (40 if args.quick else 80)
    head_channels = args.head_channels or (16 if args.quick else 64)
    device = torch.device(args.device)

    with tempfile.TemporaryDirectory() as tmp:
        root = write_synthetic_nyuv2(
            Path(tmp) / "nyuv2", train=batch_size, val=1, height=height, width=width, seed=0
        )
        problem = load_problem(DataConfig(dataset="nyuv2", root=str(root)))
    model_config = ModelConfig(backbone=args.backbone, head_channels=head_channels)
    setup = Setup(problem, model_config, batch_size, device)
    steps = {name: our_step(name, setup) for name in OURS}
    steps.update({name: torchjd_step(name, setup) for name in TORCHJD_COUNTERPART.values()})
    print(
        f"torch {torch.__version__} on {device}, {torch.get_num_threads()} CPU thread(s); "
        f"{args.backbone}, head_channels {head_channels}, batch {batch_size}x3x{height}x{width}; "
        f"median of {rounds} interleaved rounds"
    )
    return 0 if report(measure(steps, rounds, warmup=2, cuda=device.type == "cuda")) else 1


if __name__ == "__main__":
    raise SystemExit(main())
