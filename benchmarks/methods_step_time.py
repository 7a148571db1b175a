"""Step time of every MTL method relative to ERM, and side by side with TorchJD and LibMTL.

One process, the project's NYUv2 dense model (`DenseMTLModel`: ResNet encoder at output
stride 8, seg/depth/normal heads) with a small backbone, the project's NYUv2 task losses, and
one fixed batch of synthetic NYUv2 (written by `write_synthetic_nyuv2` to a temporary
directory). All variants share that one model instance (so memory placement cannot favour any
of them) and each has its own SGD optimizer with learning rate 0 (the step runs at full cost
but the parameters stay fixed, so every variant is timed at the same point). A step is
zero_grad -> forward -> task losses -> backward (the method's, or the reference's) -> optimizer
step -> the engine's hooks (`after_step`: FAMO's re-evaluation of the batch; `end_epoch`, every
step being an epoch of this one batch: DWA's epoch means). The variants are timed
interleaved, one step each per round in a shuffled order, so machine noise hits all of them
alike; each ratio is the median over rounds of the per-round ratio, with a ~95%
distribution-free confidence interval.

Every registered method whose dependencies are installed is timed (a row each; `--methods`
picks some). Where a package
implements the same method, its step on the same model and batch is timed in the same rounds
and the table compares ours with it (target: ratio <= 1.0): TorchJD's aggregators (PCGrad,
FairGrad, UPGrad, MGDA, CAGrad, IMTL-G, Aligned-MTL, DualProj, Nash-MTL) run through
`torchjd.autojac.mtl_backward` (features: the encoder's output map, the heads' input) +
`jac_to_grad`, TorchJD's `UW` scalarizer for Uncertainty weighting, and the LibMTL 1.1.5
package's DWA and RLW (`relif_ray.testing.libmtl_reference`; DWA past its first two epochs, so
that it
computes the loss-ratio weights). FAMO and DB-MTL are in no package (LibMTL 1.1.5 predates
them). ERM+ReLiF is not timed here (see the ReLiF benchmarks); peak memory per method is the
memory section of `run.py` (one process per method).

Representation mode (`method.gradient_source: representation`, the methods of the registry
that offer it: GradNorm and PCGrad): its step time over ERM's (target <= 1.3), and how far
its update is from the exact one: both modes run side by side on the same model and batch
(learning rate 0, each method updating its own state), and each step gives the cosine
between the two full parameter gradients (every model parameter, flattened), i.e. the two
update directions of plain SGD. Reported: the cosine at the first step and the mean and
minimum over `cosine_steps` steps (GradNorm's first step is exact by construction: both
modes start from w = 1; later steps differ through the weights).

    python benchmarks/methods_step_time.py --quick     # a few minutes on one CPU thread
    python benchmarks/methods_step_time.py --quick --methods erm,famo,dwa
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import torch
import torchjd.aggregation as jd
from timing import Step, interleaved_times, ratio_with_interval, verdict_at_most
from torch import Tensor
from torchjd.autojac import jac_to_grad, mtl_backward
from torchjd.scalarization import UW

from relif_ray.config import DataConfig, ModelConfig
from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
from relif_ray.methods import METHODS, MTLMethod, StepContext, build_method
from relif_ray.methods.registry import missing_requirements
from relif_ray.problems import Problem, load_problem
from relif_ray.tasks.base import Batch
from relif_ray.testing.libmtl_reference import libmtl_weighting
from relif_ray.transfer import move_batch

ALL_METHODS = sorted(
    (name for name, cls in METHODS.items() if not missing_requirements(cls)),
    key=lambda name: (name != "erm", name),
)
"""Every registered method whose dependencies are installed, ERM first (the reference of every
ratio); a machine without the `mtl` extra's solvers (the bare GPU machine may lack some) times
the others."""
REPRESENTATION_TARGET = 1.3
FAIRGRAD_ALPHA = 2.0
TORCHJD_AGGREGATORS: dict[str, Callable[[int], jd.Aggregator]] = {
    "pcgrad": lambda k: jd.PCGrad(),
    "fairgrad": lambda k: jd.FairGrad(alpha=FAIRGRAD_ALPHA),
    "upgrad": lambda k: jd.UPGrad(),
    "mgda": lambda k: jd.MGDA(),
    "cagrad": lambda k: jd.CAGrad(c=METHODS["cagrad"].option_defaults()["c"]),
    "imtlg": lambda k: jd.IMTLG(),
    "alignedmtl": lambda k: jd.AlignedMTL(),
    "dualproj": lambda k: jd.DualProj(),
    "nashmtl": lambda k: jd.NashMTL(n_tasks=k),
}
"""TorchJD's aggregator of each method, with our default options."""
COUNTERPART = {
    **{name: f"torchjd-{name}" for name in TORCHJD_AGGREGATORS},
    "uncertainty": "torchjd-uw",
    "dwa": "libmtl-dwa",
    "rlw": "libmtl-rlw",
}
"""Our method -> the package variant timed beside it."""
LIBMTL_INSTALLED = find_spec("LibMTL") is not None
"""The LibMTL variants are timed only where the LibMTL 1.1.5 package is installed."""
DWA_TEMPERATURE = 2.0
TARGET = 1.0


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
        shared = {id(p) for p in self.model.shared_parameters()}
        self.head_parameters = [p for p in self.model.parameters() if id(p) not in shared]
        self.encoded: Tensor | None = None

    def losses(self) -> dict[str, Tensor]:
        """Forward and task losses; the encoder output is left in `self.encoded`."""
        output = self.model(self.batch)
        self.encoded = output.encoder_output
        return {
            task.name: task.loss(output.predictions[task.name], self.batch[task.name])
            for task in self.tasks
        }

    def stacked_losses(self) -> Tensor:
        losses = self.losses()
        return torch.stack([losses[t] for t in self.task_names])

    @torch.no_grad()
    def updated_losses(self) -> dict[str, Tensor]:
        """The engine's re-evaluation of the batch after the step (`MTLMethod.after_step`)."""
        return self.losses()


def new_method(name: str, setup: Setup, source: str = "parameters") -> MTLMethod:
    options = {"alpha": FAIRGRAD_ALPHA} if name == "fairgrad" else {}
    device = next(setup.model.parameters()).device
    return build_method(name, setup.task_names, 0, gradient_source=source, **options).to(device)


def method_backward(method: MTLMethod, setup: Setup, step: int) -> None:
    """Forward, task losses and the method's backward, with the engine's step context."""
    model = setup.model
    losses = setup.losses()
    context = StepContext(
        model.shared_parameters(),
        model.last_shared_parameters(),
        step,
        encoder_output=setup.encoded,
        head_parameters=setup.head_parameters,
    )
    method.backward(losses, context, None)


def our_step(name: str, setup: Setup, source: str = "parameters") -> Step:
    method = new_method(name, setup, source)
    optimizer = torch.optim.SGD([*setup.model.parameters(), *method.parameters()], lr=0.0)
    counter = iter(range(10**9))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        method_backward(method, setup, next(counter))
        optimizer.step()
        method.after_step(setup.updated_losses)
        method.end_epoch()

    return step


def update_cosines(name: str, setup: Setup, steps: int) -> list[float]:
    """Per step, the cosine between the exact and the representation-mode parameter gradient
    on the same (fixed) model and batch; each mode's method keeps its own state."""
    modes = [new_method(name, setup, source) for source in ("parameters", "representation")]
    cosines = []
    for step in range(steps):
        flat = []
        for method in modes:
            setup.model.zero_grad(set_to_none=True)
            method_backward(method, setup, step)
            grads = [p.grad.reshape(-1) for p in setup.model.parameters()]
            flat.append(torch.cat(grads).double())  # fp64: a long fp32 dot drifts past 1
        cosines.append(float(torch.nn.functional.cosine_similarity(*flat, dim=0)))
    setup.model.zero_grad(set_to_none=True)
    return cosines


def has_counterpart(method: str) -> bool:
    """Whether a package variant of `method` is timed: `COUNTERPART` has one and its package
    is installed."""
    return method in COUNTERPART and (
        LIBMTL_INSTALLED or not COUNTERPART[method].startswith("libmtl")
    )


def counterpart_step(method: str, setup: Setup) -> Step:
    """The step of the package implementation of `method` (`COUNTERPART`)."""
    if method == "uncertainty":
        return torchjd_uw_step(setup)
    if method in ("dwa", "rlw"):
        return libmtl_step(method, setup)
    return torchjd_step(TORCHJD_AGGREGATORS[method](len(setup.task_names)), setup)


def torchjd_uw_step(setup: Setup) -> Step:
    model = setup.model
    scalarizer = UW(len(setup.task_names)).to(next(model.parameters()).device)
    optimizer = torch.optim.SGD([*model.parameters(), *scalarizer.parameters()], lr=0.0)

    def uw_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        scalarizer(setup.stacked_losses()).backward()
        optimizer.step()

    return uw_step


def torchjd_step(aggregator: jd.Aggregator, setup: Setup) -> Step:
    model = setup.model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    shared = model.shared_parameters()
    heads = [list(model.heads[t].parameters()) for t in setup.task_names]

    def jd_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        losses = setup.losses()
        mtl_backward(
            [losses[t] for t in setup.task_names],
            features=setup.encoded,
            tasks_params=heads,
            shared_params=shared,
        )
        jac_to_grad(shared, aggregator)
        optimizer.step()

    return jd_step


def libmtl_step(method: str, setup: Setup) -> Step:
    """LibMTL 1.1.5's DWA (at epoch 2, from a buffer of two epochs' mean losses) or RLW."""
    device = next(setup.model.parameters()).device
    count = len(setup.task_names)
    if method == "dwa":
        weighting = libmtl_weighting(
            "DWA", count, device=device, epoch=2, train_loss_buffer=torch.rand(count, 3).numpy()
        )
        options = {"T": DWA_TEMPERATURE}
    else:
        weighting = libmtl_weighting("RLW", count, device=device)
        options = {"dist": "Normal"}
    optimizer = torch.optim.SGD(setup.model.parameters(), lr=0.0)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        weighting.backward(setup.stacked_losses(), **options)
        optimizer.step()

    return step


@dataclass
class MethodTiming:
    """One variant's median step time, its ratio to ERM and, where a package has the method
    (`COUNTERPART`), its ratio to the package's with the ~95% interval and the verdict
    (target <= 1.0); for a representation-mode variant, the interval and verdict of its ratio
    to ERM (<= 1.3)."""

    ms_per_step: float
    vs_erm: float
    vs_package: tuple[float, float, float] | None = None
    verdict: str | None = None
    vs_erm_interval: tuple[float, float] | None = None
    erm_verdict: str | None = None


def summarize(times: dict[str, list[float]]) -> dict[str, MethodTiming]:
    summary = {}
    for name in times:
        timing = MethodTiming(
            ms_per_step=1e3 * statistics.median(times[name]),
            vs_erm=ratio_with_interval(times, name, "erm")[0],
        )
        if name.endswith("-representation"):
            median, lower, upper = ratio_with_interval(times, name, "erm")
            timing.vs_erm_interval = (lower, upper)
            timing.erm_verdict = verdict_at_most(median, lower, REPRESENTATION_TARGET)
        if COUNTERPART.get(name) in times:
            median, lower, upper = ratio_with_interval(times, name, COUNTERPART[name])
            timing.vs_package = (median, lower, upper)
            timing.verdict = verdict_at_most(median, lower, TARGET)
        summary[name] = timing
    return summary


def report(summary: dict[str, MethodTiming], cosines: dict[str, list[float]]) -> bool:
    """Print the table; False when some method is measurably slower than its target."""
    header = f"{'variant':<24}{'ms/step':>9}{'vs erm':>8}   {'vs package [95% CI]':>22}"
    print(f"{header}  target  result")
    for name, timing in summary.items():
        line = f"{name:<24}{timing.ms_per_step:>9.1f}{timing.vs_erm:>8.2f}"
        if timing.vs_package is not None:
            median, lower, upper = timing.vs_package
            interval = f"{median:.2f} [{lower:.2f}, {upper:.2f}]"
            line += f"   {interval:>22}  <= {TARGET}  {timing.verdict}"
        if timing.erm_verdict is not None:
            lower, upper = timing.vs_erm_interval
            interval = f"vs erm [{lower:.2f}, {upper:.2f}]"
            line += f"   {interval:>22}  <= {REPRESENTATION_TARGET}  {timing.erm_verdict}"
        print(line)
    for name, values in cosines.items():
        print(
            f"{name}: cosine(representation, exact update) first {values[0]:.4f}, "
            f"mean {statistics.mean(values):.4f}, min {min(values):.4f} over {len(values)} steps"
        )
    verdicts = [t.verdict for t in summary.values()] + [t.erm_verdict for t in summary.values()]
    return "FAIL" not in verdicts


def measure(
    device: str = "cpu",
    quick: bool = False,
    rounds: int | None = None,
    batch_size: int | None = None,
    height: int | None = None,
    width: int | None = None,
    backbone: str = "resnet18",
    head_channels: int | None = None,
    cosine_steps: int = 20,
    methods: Sequence[str] | None = None,
) -> tuple[str, dict[str, MethodTiming], dict[str, list[float]]]:
    """Time every variant of `methods` (default: every registered one; ERM is always timed)
    interleaved: each method, its representation mode if it has one, its package counterpart
    if there is one. Return a one-line description of the setting, the summary, and per
    representation-mode method the update cosines of `cosine_steps` steps. Sizes default to
    tiny ones with `quick` (CPU), else moderate ones."""
    names = ["erm", *(n for n in (methods or ALL_METHODS) if n != "erm")]
    representation = [n for n in names if "representation" in METHODS[n].gradient_sources]
    rounds = rounds or (10 if quick else 40)
    batch_size = batch_size or (4 if quick else 8)
    height = height or (32 if quick else 64)
    width = width or (40 if quick else 80)
    head_channels = head_channels or (16 if quick else 64)
    with tempfile.TemporaryDirectory() as tmp:
        root = write_synthetic_nyuv2(
            Path(tmp) / "nyuv2", train=batch_size, val=1, height=height, width=width, seed=0
        )
        problem = load_problem(DataConfig(dataset="nyuv2", root=str(root)))
    model_config = ModelConfig(backbone=backbone, head_channels=head_channels)
    setup = Setup(problem, model_config, batch_size, torch.device(device))
    steps = {name: our_step(name, setup) for name in names}
    steps.update(
        {f"{n}-representation": our_step(n, setup, "representation") for n in representation}
    )
    steps.update({COUNTERPART[n]: counterpart_step(n, setup) for n in names if has_counterpart(n)})
    times = interleaved_times(steps, rounds, warmup=2, cuda=device.startswith("cuda"))
    cosines = {name: update_cosines(name, setup, cosine_steps) for name in representation}
    description = (
        f"{backbone}, head_channels {head_channels}, batch {batch_size}x3x{height}x{width}, "
        f"median of {rounds} interleaved rounds"
    )
    return description, summarize(times), cosines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds")
    parser.add_argument(
        "--methods", default=None, help="comma-separated registered methods (default: all)"
    )
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
    description, summary, cosines = measure(
        args.device,
        args.quick,
        args.rounds,
        args.batch_size,
        args.height,
        args.width,
        args.backbone,
        args.head_channels,
        methods=args.methods.split(",") if args.methods else None,
    )
    print(
        f"torch {torch.__version__} on {args.device}, {torch.get_num_threads()} CPU thread(s); "
        f"{description}"
    )
    return 0 if report(summary, cosines) else 1


if __name__ == "__main__":
    raise SystemExit(main())
