"""The `architectures` suite: each NYUv2 architecture's step time against LibMTL 1.1.5's
architecture of the same name built on the same encoders (`relif_ray.testing.libmtl_reference`:
the very same modules, so the same weights and work), and its peak memory per trial."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks.harness import Context, interleaved_times, ratio_with_interval, trained_on
from benchmarks.methods import sgd_step
from benchmarks.workers import GPU_SIZE, data_root, setting_text, timed_worker, trial_config
from relif_ray.config import DataConfig, ModelConfig
from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
from relif_ray.experiment.record import CUDA_PEAK_MB
from relif_ray.models.architectures import ARCHITECTURES, RESNET, build_dense_model
from relif_ray.problems import load_problem
from relif_ray.testing.libmtl_reference import LIBMTL_NAMES, libmtl_architecture
from relif_ray.transfer import move_batch

QUICK_OPTIONS = {
    "mmoe": {"num_experts": 2},
    "cgc": {"num_experts": 1, "task_experts": 1},
    "ple": {"num_experts": 1, "task_experts": 1},
    "dselect_k": {"num_experts": 2, "num_nonzeros": 1},
}
"""Expert counts below the real size (each expert is a whole encoder); else the defaults."""


class ResizedHead(nn.Module):
    """One of our heads as LibMTL's decoder: its prediction, resized to the image as ours is."""

    def __init__(self, head: nn.Module, size: tuple[int, int]) -> None:
        super().__init__()
        self.head, self.size = head, size

    def forward(self, features: Tensor) -> Tensor:
        prediction = self.head(features)[0]
        return F.interpolate(prediction, self.size, mode="bilinear",
                             align_corners=self.head.align_corners)  # fmt: skip


def steps_of(name: str, problem, config: ModelConfig, batch: dict, device) -> dict:  # noqa: ANN001
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

    def ours() -> None:
        output = model(batch)
        extra = output.auxiliary_loss
        (losses(output.predictions) + (extra if extra is not None else 0.0)).backward()

    def libmtl() -> None:
        predictions = theirs(image)
        predictions["normal"] = F.normalize(predictions["normal"], dim=1)
        losses(predictions).backward()

    return {name: sgd_step(list(model.parameters()), ours),
            f"libmtl-{name}": sgd_step(list(theirs.parameters()), libmtl)}  # fmt: skip


def architectures_suite(ctx: Context, names: tuple[str, ...] | None = None,
                        rounds: int | None = None) -> None:  # fmt: skip
    """The step-time rows of `names` (default: every NYUv2 architecture), then their memory."""
    names = names or tuple(n for n, a in ARCHITECTURES.items() if RESNET in a.encoders)
    quick = ctx.size != "real"
    rounds = rounds or {"toy": 1, "demo": 5, "real": 30}[ctx.size]
    batch_size, height, width = (2, 32, 40) if quick else (8, 64, 80)
    backbone = GPU_SIZE["backbone"] if ctx.cuda else "resnet18"
    if ctx.cuda:
        batch_size, height, width = (GPU_SIZE[k] for k in ("batch_size", "height", "width"))
    with tempfile.TemporaryDirectory() as tmp:
        root = write_synthetic_nyuv2(Path(tmp) / "nyuv2", train=batch_size, val=1, height=height,
                                     width=width, seed=0)  # fmt: skip
        problem = load_problem(DataConfig(dataset="nyuv2", root=str(root)))
    batch = move_batch(problem.splits["train"].batch(torch.arange(batch_size)), ctx.device)
    steps = {}
    for name in names:
        options = QUICK_OPTIONS.get(name, {}) if quick else {}
        config = ModelConfig(backbone=backbone, head_channels=16, architecture=name,
                             architecture_options=options)  # fmt: skip
        steps.update(steps_of(name, problem, config, batch, ctx.device))
    times = interleaved_times(steps, rounds, warmup=2, cuda=ctx.cuda)
    description = (f"{backbone}, simple heads of 16 channels, batch {batch_size}x3x{height}x"
                   f"{width}, {'the fewest experts' if quick else 'default expert counts'}, "
                   f"median of {rounds} interleaved rounds")  # fmt: skip
    for name in names:
        ratio, lower, upper = ratio_with_interval(times, name, f"libmtl-{name}")
        ours, theirs = (1e3 * statistics.median(times[n]) for n in (name, f"libmtl-{name}"))
        ctx.judged("architecture / LibMTL step time", f"{name} / LibMTL {LIBMTL_NAMES[name]} "
                   f"step time", ratio, "x", f"[{lower:.2f}, {upper:.2f}]; {ours:.1f} against "
                   f"{theirs:.1f} ms/step; {description}", (lower, upper))  # fmt: skip
    for name in names:
        with ctx.step(f"peak memory per trial, architecture {name}"):
            memory_row(ctx, name, QUICK_OPTIONS.get(name, {}) if quick else {})


def memory_row(ctx: Context, name: str, options: dict) -> None:
    """Peak memory of one ERM trial of architecture `name`, in its own worker process."""
    root = data_root(ctx, ctx.gpu_rows)
    config = trial_config(ctx, root, "erm", ctx.gpu_rows)
    config["model"].update(architecture=name, architecture_options=options)
    result = timed_worker(ctx, config)
    peak = CUDA_PEAK_MB if ctx.cuda else "peak_rss_mb"
    where = "torch.cuda.max_memory_allocated" if ctx.cuda else "peak RSS, one process"
    devices = trained_on(ctx, [result["device"]], f"architecture {name}")
    ctx.row(f"peak {'GPU memory' if ctx.cuda else 'RSS'} per trial, architecture {name}",
            result[peak], "MiB", f"{setting_text(config, root)}, ERM, {where}, {devices}"
            )  # fmt: skip
