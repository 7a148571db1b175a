"""Where a trial's time goes: one real trial through the sweep's Trainable, epoch by epoch.

One ERM trial runs on local Ray through `relif_ray.tuning.launch.run_sweep` with the sweep's
settings (its checkpoint cadence, outputs in the final checkpoint); its Trainable is the
sweep's own, instrumented only to record when each step and each save starts and ends
(`sweep_efficiency.TimedTrainable`). Per epoch:

- train, evaluate, audit: the seconds the Trainable reports for its training steps, the
  validation pass and the live audit (`time_train_s`, `time_evaluate_s`, `time_audit_s`);
- checkpoint: the save that followed the epoch, if any (written and persisted to storage);
- rest: the epoch's span (from its step's start to the next step's start, or to the end of
  the final save) less all of the above: Tune's report and bookkeeping;
- train share: train / span.

Then, on the trial's final state loaded in this process, the before and the after in one run:
the validation pass of the host path the device path replaced (`relif_ray.testing.host_evaluation`)
and of the device path, and the checkpoint's size, with the share of an epoch the trial's own
checkpoint took at one checkpoint after every epoch (before) and at the cadence that keeps
checkpoints under `CHECKPOINT_SHARE` of a trial's time (after).

    python benchmarks/trial_breakdown.py --size demo      # the demo's trial size, CPU
    python benchmarks/trial_breakdown.py --size larger    # ResNet-50 at 96x128, CPU
    python benchmarks/trial_breakdown.py --size real      # 795/654 at 288x384, one GPU
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class BreakdownSize:
    """One trial's data and model: `epochs` of `train` images at `height` x `width`,
    validated on `val` images, batches of 8."""

    name: str
    backbone: str
    height: int
    width: int
    train: int
    val: int
    epochs: int
    lr: float = 1e-3


SIZES = {
    size.name: size
    for size in (
        BreakdownSize("demo", "resnet18", 48, 64, 48, 24, 8),
        BreakdownSize("larger", "resnet50", 96, 128, 32, 32, 3),
        BreakdownSize("real", "resnet50", 288, 384, 795, 654, 3, lr=1e-4),
        BreakdownSize("toy", "resnet18", 32, 40, 16, 8, 2),
    )
}
"""demo: the demo's data and model (`--demo`: 48 train / 24 val at 48x64, ResNet-18); larger:
ResNet-50 at 96x128; real: the paper's NYUv2 size (ResNet-50, 288x384, 795 / 654); toy: the
dry run's and the tests' size."""
PARTS = ("train", "evaluate", "audit", "checkpoint", "rest")
BATCH_SIZE = 8


def trial_config(size: BreakdownSize, root: Path, cuda: bool) -> dict:
    """The trial's config: the engine's CPU defaults, or on a GPU the fast path the GPU rows
    use (bf16 forward, channels-last, data on the device)."""
    train = {"epochs": size.epochs, "batch_size": BATCH_SIZE, "lr": size.lr}
    if cuda:
        train.update(precision="bf16", channels_last=True, data_on_device=True)
    return {
        "data": {"dataset": "nyuv2", "root": str(root)},
        "model": {"backbone": size.backbone, "pretrained": "none"},
        "train": train,
    }


def run_trial(size: BreakdownSize, root: Path, workdir: Path, cuda: bool) -> Path:
    """One ERM trial through the sweep's `run_sweep`; its trial folder. The step and save
    timings land in `workdir/timing`."""
    import ray
    from sweep_efficiency import TimedTrainable

    from relif_ray.sweep.labels import variant
    from relif_ray.sweep.plan import Resources, param_space
    from relif_ray.tuning.launch import connect, run_sweep

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    resources = Resources(gpus_per_trial=1.0, num_gpus=1.0) if cuda else Resources(num_cpus=1)
    space = param_space(trial_config(size, root, cuda), [variant("erm")], [0], 0.2)
    space.constants["timing_dir"] = str(workdir / "timing")
    (workdir / "timing").mkdir(parents=True, exist_ok=True)
    connect(resources)
    try:
        experiment = run_sweep(
            space,
            name="breakdown",
            storage=str(workdir / "results"),
            resources=resources,
            checkpoint_interval_s=10.0,
            verbose=0,
            trainable=TimedTrainable,
        )
    finally:
        ray.shutdown()
    return next(path for path in Path(experiment).iterdir() if path.is_dir())


def epoch_parts(trial_dir: Path, timing_dir: Path) -> list[dict[str, float]]:
    """Per epoch: the seconds of each of `PARTS`, the span and the train share."""
    results = [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines()]
    records = [
        json.loads(line)
        for path in timing_dir.glob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    spans = sorted((r["end"] - r["seconds"], r["end"], r["phase"]) for r in records)
    starts = [start for start, _, phase in spans if phase == "step"]
    ends = [*starts[1:], spans[-1][1]]  # the next step's start; the final save's end
    epochs = []
    for result, start, end in zip(results, starts, ends, strict=True):
        parts = {part: result[f"time_{part}_s"] for part in ("train", "evaluate", "audit")}
        saves = [b - a for a, b, phase in spans if phase == "save" and start < a < end]
        parts["checkpoint"] = sum(saves)
        parts["rest"] = end - start - sum(parts.values())
        epochs.append({**parts, "span": end - start, "train_share": parts["train"] / (end - start)})
    return epochs


def timed(function: Callable[[], object], repeats: int = 2) -> float:
    """The fastest of `repeats` calls of `function`, after one warm-up call."""
    function()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - start)
    return min(seconds)


def before_and_after(trial_dir: Path, workdir: Path, cuda: bool) -> dict[str, float]:
    """On the trial's final state in this process: the validation pass of the host path and
    of the device path, and one checkpoint as a trial writes it (`write_state` of the engine's
    state, then Tune's copy into storage), its size and seconds."""
    from relif_ray.config import ExperimentConfig
    from relif_ray.engine import TrainingRun
    from relif_ray.testing.host_evaluation import host_evaluate
    from relif_ray.tuning.trainable import write_state

    checkpoint = max(trial_dir.glob("checkpoint_*"), key=lambda path: path.name)
    config = json.loads((checkpoint / "outputs" / "trial.json").read_text())["config"]
    run = TrainingRun(ExperimentConfig.from_dict({**config, "device": "cuda" if cuda else "cpu"}))
    run.load_state_dict(torch.load(checkpoint / "state.pt", weights_only=True))
    written, persisted = workdir / "state.pt", workdir / "persisted.pt"

    def write_checkpoint() -> None:
        write_state(run.state_dict(), written)
        shutil.copyfile(written, persisted)

    return {
        "evaluate_host_s": timed(lambda: host_evaluate(run)),
        "evaluate_device_s": timed(run.evaluate),
        "checkpoint_write_s": timed(write_checkpoint),
        "checkpoint_mb": written.stat().st_size / 1e6,
    }


def measure(size: BreakdownSize, workdir: Path, cuda: bool, root: Path | None = None) -> dict:
    """The trial's per-epoch breakdown and the before/after figures (module docstring)."""
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2

    if root is None:
        root = workdir / f"data-{size.name}"
        if not root.exists():
            write_synthetic_nyuv2(
                root, train=size.train, val=size.val, height=size.height, width=size.width, seed=0
            )
    trial_dir = run_trial(size, root, workdir, cuda)
    return {
        "size": size.name,
        "epochs": epoch_parts(trial_dir, workdir / "timing"),
        **before_and_after(trial_dir, workdir, cuda),
    }


def summary(measured: dict) -> dict[str, float]:
    """Means over the epochs (each part's seconds, the span) and the train shares: measured
    (this trial: the device path, the sweep's checkpoint cadence), and before (the host
    evaluation instead, and a checkpoint after every epoch), from the same run's figures."""
    epochs = measured["epochs"]
    means = {part: sum(epoch[part] for epoch in epochs) / len(epochs) for part in PARTS}
    span = sum(epoch["span"] for epoch in epochs) / len(epochs)
    without = span - means["evaluate"] - means["checkpoint"]  # train, audit, rest
    checkpoint = measured["checkpoint_write_s"]
    before = without + measured["evaluate_host_s"] + checkpoint
    return {
        **{f"{part}_s": value for part, value in means.items()},
        "span_s": span,
        "train_share": means["train"] / span,
        "train_share_before": means["train"] / before,
        "checkpoint_share_every_epoch": checkpoint / (without + means["evaluate"] + checkpoint),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=list(SIZES), default="demo")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        measured = measure(SIZES[args.size], Path(tmp), args.device == "cuda")
    print(json.dumps({**measured, "summary": summary(measured)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
