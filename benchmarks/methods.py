"""The `methods` suite: every method's step time over ERM's and over the same method in TorchJD
or LibMTL 1.1.5, and the representation-gradient modes' step times and update cosines; with the
GPU rows, each method's images/s and memory in a worker first. All variants share one model
and one batch, each with its own SGD at learning rate 0 (full cost, fixed parameters), so that
every variant is timed at the same point (docs/benchmarks.md says what a step holds)."""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path

import torch
from torch import Tensor

from benchmarks.harness import OUT_OF_TIME, Context, interleaved_times, ratio_with_interval
from benchmarks.throughput import GRAPHED, variant_rows
from benchmarks.workers import GPU_SIZE, variants
from relif_ray.config import DataConfig, ModelConfig
from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
from relif_ray.methods import METHODS, MTLMethod, StepContext, build_method
from relif_ray.methods.registry import missing_requirements
from relif_ray.problems import Problem, load_problem
from relif_ray.transfer import move_batch

FAIRGRAD_ALPHA = 2.0
DWA_TEMPERATURE = 2.0
TORCHJD = {
    "pcgrad": "PCGrad", "fairgrad": "FairGrad", "upgrad": "UPGrad", "mgda": "MGDA",
    "cagrad": "CAGrad", "imtlg": "IMTLG", "alignedmtl": "AlignedMTL", "dualproj": "DualProj",
    "nashmtl": "NashMTL",
}  # fmt: skip
"""Our method -> TorchJD's aggregator of it (with our default options, `torchjd_aggregator`)."""
COUNTERPART = {
    **{name: f"torchjd-{name}" for name in TORCHJD},
    "uncertainty": "torchjd-uw",
    "dwa": "libmtl-dwa",
    "rlw": "libmtl-rlw",
}
"""Our method -> the package variant timed beside it (LibMTL's where LibMTL is installed)."""
FIRST = ("pcgrad", "fairgrad", "upgrad", "nashmtl")
"""The gradient-aggregation methods whose GPU throughput is asked first."""
HOST_SOLVE_TARGET = "host-solving method images/s / graphed ERM images/s"
"""Each method graphed around its host solve against graphed ERM (`targets.TARGETS`)."""
Step = Callable[[], None]


class Setup:
    """The shared model, its tasks and one batch on the device."""

    def __init__(self, problem: Problem, model_config: ModelConfig, batch_size: int, device):
        torch.manual_seed(0)
        self.tasks, self.task_names = problem.tasks, problem.task_names
        self.model = problem.build_model(model_config).to(device).train()
        self.batch = move_batch(problem.splits["train"].batch(torch.arange(batch_size)), device)
        shared = {id(p) for p in self.model.shared_parameters()}
        self.head_parameters = [p for p in self.model.parameters() if id(p) not in shared]
        self.encoded: Tensor | None = None

    def losses(self) -> dict[str, Tensor]:
        """Forward and task losses; the encoder output is left in `self.encoded`."""
        output = self.model(self.batch)
        self.encoded = output.encoder_output
        return {t.name: t.loss(output.predictions[t.name], self.batch[t.name]) for t in self.tasks}

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
    context = StepContext(model.shared_parameters(), model.last_shared_parameters(), step,
                          setup.encoded, head_parameters=setup.head_parameters)  # fmt: skip
    method.backward(losses, context, None)


def sgd_step(parameters: list, backward: Callable[[], None]) -> Step:
    optimizer = torch.optim.SGD(parameters, lr=0.0)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        backward()
        optimizer.step()

    return step


def our_step(name: str, setup: Setup, source: str = "parameters") -> Step:
    method = new_method(name, setup, source)
    counter = iter(range(10**9))
    step = sgd_step([*setup.model.parameters(), *method.parameters()],
                    lambda: method_backward(method, setup, next(counter)))  # fmt: skip

    def with_hooks() -> None:
        step()
        method.after_step(setup.updated_losses)
        method.end_epoch()

    return with_hooks


def counterpart_step(method: str, setup: Setup) -> Step:
    """The step of the package implementation of `method` (`COUNTERPART`)."""
    import torchjd.aggregation as jd
    from torchjd.autojac import jac_to_grad, mtl_backward
    from torchjd.scalarization import UW

    from relif_ray.testing.libmtl_reference import libmtl_weighting

    model, count = setup.model, len(setup.task_names)
    device = next(model.parameters()).device
    if method == "uncertainty":
        scalarizer = UW(count).to(device)
        return sgd_step([*model.parameters(), *scalarizer.parameters()],
                        lambda: scalarizer(setup.stacked_losses()).backward())  # fmt: skip
    if method in ("dwa", "rlw"):  # DWA at epoch 2, from a buffer of two epochs' mean losses
        weighting, options = libmtl_weighting("RLW", count, device=device), {"dist": "Normal"}
        if method == "dwa":
            buffer = torch.rand(count, 3).numpy()
            weighting = libmtl_weighting("DWA", count, device=device, epoch=2,
                                         train_loss_buffer=buffer)  # fmt: skip
            options = {"T": DWA_TEMPERATURE}
        return sgd_step(list(model.parameters()),
                        lambda: weighting.backward(setup.stacked_losses(), **options))  # fmt: skip
    cagrad = {"c": METHODS["cagrad"].option_defaults()["c"]}
    options = {"fairgrad": {"alpha": FAIRGRAD_ALPHA}, "nashmtl": {"n_tasks": count},
               "cagrad": cagrad}.get(method, {})  # fmt: skip
    aggregator = getattr(jd, TORCHJD[method])(**options)
    shared = model.shared_parameters()
    heads = [list(model.heads[t].parameters()) for t in setup.task_names]

    def jd_backward() -> None:
        losses = setup.losses()
        mtl_backward([losses[t] for t in setup.task_names], features=setup.encoded,
                     tasks_params=heads, shared_params=shared)  # fmt: skip
        jac_to_grad(shared, aggregator)

    return sgd_step(list(model.parameters()), jd_backward)


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


def sizes(ctx: Context) -> dict:
    """Rounds, untimed warmup rounds, batch, image, backbone, head channels and cosine steps at
    the context's size. At toy size (the tests and the dry run, where no time is judged) one
    warmup and one timed round and two cosine steps: each row is made, its figure is not one."""
    if ctx.cuda:
        return {"rounds": 20, "warmup": 2, "batch": 8, "backbone": GPU_SIZE["backbone"],
                "image": (GPU_SIZE["height"], GPU_SIZE["width"]), "heads": 128,
                "cosine_steps": 10}  # fmt: skip
    small = {"rounds": 10, "warmup": 2, "batch": 4, "image": (32, 40), "heads": 16,
             "cosine_steps": 20}  # fmt: skip
    return {"backbone": "resnet18", **{
        "toy": {**small, "rounds": 1, "warmup": 1, "cosine_steps": 2}, "demo": small,
        "real": {**small, "rounds": 40, "batch": 8, "image": (64, 80), "heads": 64},
    }[ctx.size]}  # fmt: skip


def measure(ctx: Context, methods: list[str] | None = None) -> tuple[str, dict, dict]:
    """Every variant of `methods` (default: every registered one whose dependencies are
    installed; ERM always) timed interleaved: each method, its representation mode if it has
    one, its package counterpart if there is one. (description, times, cosines)."""
    size = sizes(ctx)
    installed = sorted(name for name, cls in METHODS.items() if not missing_requirements(cls))
    names = ["erm", *(n for n in (methods or installed) if n != "erm")]
    representation = [n for n in names if "representation" in METHODS[n].gradient_sources]
    height, width = size["image"]
    with tempfile.TemporaryDirectory() as tmp:
        root = write_synthetic_nyuv2(Path(tmp) / "nyuv2", train=size["batch"], val=1,
                                     height=height, width=width, seed=0)  # fmt: skip
        problem = load_problem(DataConfig(dataset="nyuv2", root=str(root)))
    model = ModelConfig(backbone=size["backbone"], head_channels=size["heads"])
    setup = Setup(problem, model, size["batch"], ctx.device)
    steps = {name: our_step(name, setup) for name in names}
    steps |= {f"{n}-representation": our_step(n, setup, "representation") for n in representation}
    libmtl = find_spec("LibMTL") is not None  # its variants are timed where it is installed
    packaged = [n for n in names if n in COUNTERPART and (libmtl or "libmtl" not in COUNTERPART[n])]
    steps |= {COUNTERPART[n]: counterpart_step(n, setup) for n in packaged}
    times = interleaved_times(steps, size["rounds"], size["warmup"], cuda=ctx.cuda)
    cosines = {name: update_cosines(name, setup, size["cosine_steps"]) for name in representation}
    description = (f"{size['backbone']}, head_channels {size['heads']}, batch {size['batch']}x3x"
                   f"{height}x{width}, median of {size['rounds']} interleaved rounds")  # fmt: skip
    return description, times, cosines


def step_time_rows(ctx: Context, methods: list[str] | None = None) -> None:
    description, times, cosines = measure(ctx, methods)
    for name in times:
        if name == "erm" or name in COUNTERPART.values():
            continue
        ratio, lower, upper = ratio_with_interval(times, name, "erm")
        detail = f"{1e3 * statistics.median(times[name]):.1f} ms/step; {description}"
        if name.endswith("-representation"):
            ctx.judged("representation mode / ERM step time", f"{name} / ERM step time", ratio,
                       "x", f"[{lower:.2f}, {upper:.2f}]; {detail}", (lower, upper))  # fmt: skip
        else:
            ctx.row(f"{name} / ERM step time", ratio, "x", detail)
        if COUNTERPART.get(name) in times:
            ratio, lower, upper = ratio_with_interval(times, name, COUNTERPART[name])
            interval = f"[{lower:.2f}, {upper:.2f}]"
            ctx.judged("method / TorchJD or LibMTL step time", f"{name} / {COUNTERPART[name]} "
                       "step time", ratio, "x", interval, (lower, upper))  # fmt: skip
    for name, values in cosines.items():
        ctx.row(f"{name}-representation update cosine with exact", statistics.mean(values), "",
                f"mean over {len(values)} steps on one batch; first {values[0]:.4f}, "
                f"min {min(values):.4f}")  # fmt: skip


def methods_suite(ctx: Context) -> None:
    """The step-time rows; with the GPU rows, `FIRST`'s workers before them and every other
    method's after them, while time lasts."""
    if not ctx.gpu_rows:
        step_time_rows(ctx)
        return
    available = [v for v in variants() if v not in ("erm", "relif")]
    first = [method for method in FIRST if method in available]
    for method in first:
        method_throughput(ctx, method)
    if not ctx.has_time(35):
        ctx.skip("method / ERM and / TorchJD step times", OUT_OF_TIME)
    else:
        with ctx.step("method / ERM and / TorchJD step times"):
            step_time_rows(ctx)
    for method in [v for v in available if v not in first]:
        method_throughput(ctx, method)


def method_throughput(ctx: Context, method: str) -> None:
    """One method's worker: images/s, GPU utilisation, peak memory (if 15 s are left); for a
    method that solves on the host, its images/s over graphed ERM's (the graph suite's row)."""
    if not ctx.has_time(15):
        ctx.skip(f"training images/s, {method}", OUT_OF_TIME)
        return
    with ctx.step(f"training images/s, {method}"):
        result = variant_rows(ctx, method)
    erm = ctx.earlier_row(GRAPHED)
    if METHODS[method].splits_at_host_solve is MTLMethod.splits_at_host_solve or erm is None:
        return
    name = f"{method} images/s / graphed ERM images/s"
    ctx.judged(HOST_SOLVE_TARGET, name, result["images_per_s"] / erm.value, "x",
               f"steps {result['steps_as']}; graphed ERM {erm.value:.0f} img/s, the same "
               "trial otherwise")  # fmt: skip
