"""Real trials through the sweep's own Trainable on local Ray, subclassed only to record when
each set-up, step and save starts and ends (`TimedTrainable`): the `sweep` suite (busy trial
time over wall time x slots) and the `breakdown` suite (where one trial's time goes, epoch by
epoch); and the real-size data the sweep suites share."""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from benchmarks.harness import REPO, Context, trained_on
from relif_ray.config import ExperimentConfig
from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
from relif_ray.engine import TrainingRun
from relif_ray.experiment.outputs import read_trial_record
from relif_ray.experiment.record import DEVICE, TrialRecord, part_seconds
from relif_ray.experiment.schema import OUTPUTS_DIR
from relif_ray.experiment.storage import read_json_lines
from relif_ray.sweep.trial_config import TuneKeys
from relif_ray.tuning.trainable import ReLiFTrainable

REAL_DATA = {"train": 795, "val": 654, "height": 288, "width": 384}
"""The paper's NYUv2 size: the data of the real-size breakdown, fidelity and packing."""
TOY_DATA = {"train": 16, "val": 8, "height": 32, "width": 40}
REAL_DATA_PID = "real-data.pid"
"""In the work folder while `relif make-data` writes the real-size data in the background."""


def make_data(workdir: Path, toy: bool) -> tuple[Path, list[str]]:
    """The real-size data's folder (toy size at toy size) and the command that writes it."""
    sizes = TOY_DATA if toy else REAL_DATA
    root = workdir / f"data-{sizes['train']}-{sizes['val']}-{sizes['height']}x{sizes['width']}"
    command = [sys.executable, "-m", "relif_ray.cli", "make-data", "nyuv2", "--out", str(root)]
    return root, command + [f"--{k}={v}" for k, v in sizes.items()] + ["--seed", "0"]


def start_real_data(workdir: Path, toy: bool, log: object) -> subprocess.Popen | None:
    """Start writing the real-size data in the background (the CPU writes while the first
    suites use the GPU; `relif make-data` renames the folder into place when it is complete);
    None when it is there."""
    root, command = make_data(workdir, toy)
    if root.exists():
        return None
    process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    (workdir / REAL_DATA_PID).write_text(str(process.pid))
    return process


def real_data(ctx: Context) -> Path:
    """The real-size data: waited for while the background writer runs, else written now."""
    root, command = make_data(ctx.workdir, ctx.toy)
    pid_file = ctx.workdir / REAL_DATA_PID
    while not root.exists() and pid_file.exists() and _alive(int(pid_file.read_text())):
        if ctx.left() <= 0:
            break
        time.sleep(1.0)
    if not root.exists():
        ctx.run(command)
    return root


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (an exited one its parent has not reaped is dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class TimedTrainable(ReLiFTrainable):
    """The sweep's trainable, appending (phase, seconds, wall-clock end) of every set-up, step
    and save to a file per actor process in the folder of its Tune config's `timing_dir`
    (`relif_ray.sweep.trial_config.TuneKeys`)."""

    def _record(self, phase: str, start: float) -> None:
        seconds = time.perf_counter() - start
        line = json.dumps({"phase": phase, "seconds": seconds, "end": time.time()})
        with open(Path(self.timing_dir) / f"{os.getpid()}.jsonl", "a") as file:
            file.write(line + "\n")
        print(f"timed {phase}: {seconds:.2f} s", flush=True)  # in the log, if the suite is killed

    def setup(self, config: dict) -> None:
        start = time.perf_counter()
        self.timing_dir = TuneKeys.of(config).timing_dir
        super().setup(config)
        self._record("setup", start)
        self._print_epoch_parts()

    def _print_epoch_parts(self) -> None:
        """Print the first training step (on a GPU: warm-up, cuDNN's autotuning, the graph's
        capture), each epoch's training and each validation pass as they end, so a suite killed
        inside its first epoch still shows where the time went. The first step is its own
        `train_steps` call: the same steps and numbers, one more read of the trace."""
        run, train_epoch, evaluate = self.run, self.run.train_epoch, self.run.evaluate

        def printed_train_epoch() -> None:
            start = time.perf_counter()
            if run.step == 0:
                run.train_steps(1)
                print(f"first training step: {time.perf_counter() - start:.2f} s", flush=True)
            train_epoch()
            print(f"training of epoch {run.epoch}: {time.perf_counter() - start:.2f} s", flush=True)

        def printed_evaluate(split_name: str = "val"):  # noqa: ANN202
            start = time.perf_counter()
            result = evaluate(split_name)
            print(f"{split_name} pass: {time.perf_counter() - start:.2f} s", flush=True)
            return result

        run.train_epoch, run.evaluate = printed_train_epoch, printed_evaluate

    def step(self) -> dict:
        start = time.perf_counter()
        result = super().step()
        self._record("step", start)
        return result

    def save(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        start = time.perf_counter()
        result = super().save(*args, **kwargs)
        self._record("save", start)
        return result


def timing_records(timing_dir: Path) -> dict[str, list[dict]]:
    """Actor file -> its (phase, seconds, end) records."""
    return {p.name: [json.loads(ln) for ln in p.read_text().splitlines()]
            for p in timing_dir.glob("*.jsonl")}  # fmt: skip


def timed_sweep(space, name: str, workdir: Path, resources, **options: object) -> str:  # noqa: ANN001
    """`run_sweep` of `space` with `TimedTrainable`, its records in `workdir/timing`."""
    from relif_ray.sweep.request import SweepRequest
    from relif_ray.tuning.launch import run_sweep

    space = replace(space, shared=replace(space.shared, timing_dir=str(workdir / "timing")))
    (workdir / "timing").mkdir(parents=True, exist_ok=True)
    request = SweepRequest(name=name, storage=str(workdir / "results"), resources=resources,
                           space=space, **options)  # fmt: skip
    return run_sweep(request, verbose=0, trainable=TimedTrainable)


# --- sweep efficiency -------------------------------------------------------------------------

HEIGHT, WIDTH, BATCH, VAL = 64, 80, 8, 8


def efficiency_config(root: str, epochs: int) -> dict:
    train = {"epochs": epochs, "batch_size": BATCH, "eval_batch_size": VAL, "lr": 1e-3}
    model = {"backbone": "resnet18", "head_channels": 32}
    return {"data": {"dataset": "nyuv2", "root": root}, "model": model, "train": train}


def time_one_trial_epoch(root: str) -> tuple[float, float]:
    """(seconds per training step, seconds per validation pass) of one trial-like run."""
    torch.set_num_threads(1)
    run = TrainingRun(ExperimentConfig.from_dict(efficiency_config(root, epochs=1)))
    run.train_steps(1)
    start = time.perf_counter()
    run.train_steps(3)
    step_s = (time.perf_counter() - start) / 3
    start = time.perf_counter()
    run.evaluate("val")
    return step_s, time.perf_counter() - start


def measure_efficiency(trials: int = 8, trial_seconds: float = 30.0, epochs: int = 2,
                       slots: int = 2) -> dict[str, float]:  # fmt: skip
    """Run the grid: busy, wall, slots, their ratio and where the slots idle."""
    import ray
    from ray.tune import ExperimentAnalysis

    from relif_ray.sweep.labels import grid_variants
    from relif_ray.sweep.plan import Resources, param_space
    from relif_ray.tuning.cluster import connect

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    connect(Resources(num_cpus=slots))  # the local Ray a sweep starts
    try:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            calibration = write_synthetic_nyuv2(workdir / "calibration", train=4 * BATCH, val=VAL,
                                                height=HEIGHT, width=WIDTH, seed=0)  # fmt: skip
            timer = ray.remote(num_cpus=1)(time_one_trial_epoch)
            timings = ray.get([timer.remote(str(calibration)) for _ in range(slots)])
            step_s, eval_s = max(t[0] for t in timings), max(t[1] for t in timings)
            steps = max(1, math.ceil((trial_seconds / epochs - eval_s) / step_s))
            root = write_synthetic_nyuv2(workdir / "data", train=steps * BATCH, val=VAL,
                                         height=HEIGHT, width=WIDTH, seed=0)  # fmt: skip
            config = efficiency_config(str(root), epochs)
            base = ExperimentConfig.from_dict(config)
            space = param_space(base, grid_variants(["erm"], [], []), list(range(trials)), 0.2)
            start, started = time.perf_counter(), time.time()
            experiment = timed_sweep(
                space, "efficiency", workdir, Resources(cpus_per_trial=1), checkpoint_interval_s=0.0
            )  # every epoch
            wall = time.perf_counter() - start
            records = timing_records(workdir / "timing")
            results = [trial.last_result for trial in ExperimentAnalysis(experiment).trials]
    finally:
        ray.shutdown()
    busy = sum(r["seconds"] for actor in records.values() for r in actor)
    idle = {"start": 0.0, "between": 0.0, "end": 0.0}  # before the first work, between, after
    for actor in records.values():
        spans = sorted((r["end"] - r["seconds"], r["end"]) for r in actor)
        idle["start"] += spans[0][0] - started
        idle["between"] += sum(b[0] - a[1] for a, b in itertools.pairwise(spans))
        idle["end"] += started + wall - spans[-1][1]
    steps_only = sum(result["time_total_s"] for result in results)
    return {"trials": len(results), "slots": slots, "mean_trial_s": busy / len(results),
            "wall_s": wall, "ratio": busy / (wall * slots),
            "steps_only_ratio": steps_only / (wall * slots),
            **{f"idle_{key}_s": value for key, value in idle.items()}}  # fmt: skip


def sweep_suite(ctx: Context) -> None:
    m = measure_efficiency(trial_seconds={"toy": 2.0, "demo": 8.0, "real": 30.0}[ctx.size])
    name = "sweep efficiency, local Ray (busy / wall x slots)"
    ctx.judged("sweep efficiency", name, m["ratio"], "",
            f"{m['trials']} trials of {m['mean_trial_s']:.1f} s on {m['slots']} slots, wall "
            f"{m['wall_s']:.1f} s; idle slot-s: {m['idle_start_s']:.1f} before the first trial "
            f"(actor start, imports), {m['idle_between_s']:.1f} between, {m['idle_end_s']:.1f} "
            f"after the last; steps only {m['steps_only_ratio']:.3f}")  # fmt: skip


# --- where a trial's time goes ----------------------------------------------------------------


@dataclass(frozen=True)
class BreakdownSize:
    """One trial: `epochs` of `train` images at `height` x `width`, validated on `val`."""

    name: str
    backbone: str
    height: int
    width: int
    train: int
    val: int
    epochs: int
    lr: float = 1e-3


BREAKDOWN_SIZES = {
    "demo": BreakdownSize("demo", "resnet18", 48, 64, 48, 24, 8),
    "larger": BreakdownSize("larger", "resnet50", 96, 128, 32, 32, 3),
    "real": BreakdownSize("real", "resnet50", 288, 384, 795, 654, 3, lr=1e-4),
    "toy": BreakdownSize("toy", "resnet18", 32, 40, 16, 8, 2),
}
"""demo: the demo's data and model; larger: ResNet-50 at 96x128 (on a CPU); real: the paper's
NYUv2 size (on a GPU); toy: the dry run's and the tests' size."""
TIMED_PARTS = ("train", "evaluate", "audit")
"""The parts of an epoch the Trainable times (`relif_ray.experiment.record.TIMED_PARTS`) that
these trials run (no test pass)."""
PARTS = (*TIMED_PARTS, "checkpoint", "rest")


def run_trial(size: BreakdownSize, root: Path, workdir: Path, cuda: bool) -> Path:
    """One ERM trial through the sweep's `run_sweep`, composed as the sweep composes a trial
    (`compose_config`: NYUv2's defaults, on CUDA its GPU fast path and the sweep's device rule)
    with the size's budget, backbone and random weights; its folder."""
    import ray

    from relif_ray.problems import benchmark
    from relif_ray.sweep.compose import compose_config
    from relif_ray.sweep.labels import variant
    from relif_ray.sweep.plan import Resources, param_space
    from relif_ray.tuning.cluster import connect

    fields = {"train.epochs": size.epochs, "train.batch_size": 8, "train.lr": size.lr,
              "model.backbone": size.backbone, "model.pretrained": "none"}  # fmt: skip
    defaults = benchmark("nyuv2").defaults
    base = compose_config(defaults, [("the breakdown", fields)], str(root), use_gpu=cuda)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    resources = Resources(gpus_per_trial=1.0, num_gpus=1.0) if cuda else Resources(num_cpus=1)
    connect(resources)
    try:
        space = param_space(base, [variant("erm")], [0], defaults.delta)
        experiment = timed_sweep(space, "breakdown", workdir, resources, checkpoint_interval_s=10.0)
    finally:
        ray.shutdown()
    return next(path for path in Path(experiment).iterdir() if path.is_dir())


def epoch_parts(trial_dir: Path, timing_dir: Path) -> list[dict[str, float]]:
    """Per epoch: the seconds of each of `PARTS`, the span, the train share and the device the
    trial reported training on."""
    results = read_json_lines(trial_dir / "result.json")
    records = [r for actor in timing_records(timing_dir).values() for r in actor]
    spans = sorted((r["end"] - r["seconds"], r["end"], r["phase"]) for r in records)
    starts = [start for start, _, phase in spans if phase == "step"]
    ends = [*starts[1:], spans[-1][1]]  # the next step's start; the final save's end
    epochs = []
    for result, start, end in zip(results, starts, ends, strict=True):
        parts = {part: result.get(part_seconds(part), 0.0) for part in TIMED_PARTS}  # 0: not run
        saves = [b - a for a, b, phase in spans if phase == "save" and start < a < end]
        parts["checkpoint"] = sum(saves)
        parts["rest"] = end - start - sum(parts.values())
        span = end - start
        epochs.append({**parts, "span": span, "train_share": parts["train"] / span,
                       "device": result[DEVICE]})  # fmt: skip
    return epochs


def fastest(function, repeats: int = 2) -> float:  # noqa: ANN001
    """The fastest of `repeats` calls of `function`, after one warm-up call."""
    function()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - start)
    return min(seconds)


def before_and_after(trial_dir: Path, workdir: Path) -> dict:
    """On the trial's final state: the validation pass of the host path and of the device
    path, one checkpoint as a trial writes it (`write_state`, then Tune's copy); and the
    trial's config, final state and validation metrics (`final`, for `EVALUATION_VARIANTS`)."""
    from relif_ray.testing.host_evaluation import host_evaluate
    from relif_ray.tuning.trainable import write_state

    checkpoint = max(trial_dir.glob("checkpoint_*"), key=lambda path: path.name)
    record = read_trial_record(checkpoint / OUTPUTS_DIR)
    assert isinstance(record, TrialRecord), "a trial of one seed"
    config = record.config
    run = TrainingRun(ExperimentConfig.from_dict(config))  # the trial's own device rule
    run.load_state_dict(torch.load(checkpoint / "state.pt", weights_only=True))
    written, persisted = workdir / "state.pt", workdir / "persisted.pt"

    def write_checkpoint() -> None:
        write_state(run.state_dict(), written)
        shutil.copyfile(written, persisted)

    return {"evaluate_host_s": fastest(lambda: host_evaluate(run)),
            "evaluate_device_s": fastest(run.evaluate),
            "checkpoint_write_s": fastest(write_checkpoint),
            "checkpoint_mb": written.stat().st_size / 1e6,
            "final": (config, run.state_dict(), run.evaluate().metrics)}  # fmt: skip


EVALUATION_VARIANTS = {
    "graphed forward": {"eval_cuda_graph": True},
    "eval batch 64": {"eval_batch_size": 64},
}
"""The validation pass with other evaluation settings, against the trial's own: the defaults
of `train.eval_cuda_graph` and of a GPU `train.eval_batch_size` follow these rows."""


def evaluation_variant_rows(ctx: Context, label: str, measured: dict) -> None:
    """Each of `EVALUATION_VARIANTS` on the trial's final state, a row as it is measured: its
    validation pass's seconds (the faster of 2 after a warm-up, which captures any graphs)
    over the trial's own (`evaluate_device_s`), whether its forward was graphed, and the
    largest relative difference of its metrics from the trial's."""
    from relif_ray.cuda_graph import GraphedForward

    config, state, metrics = measured["final"]
    device = measured["evaluate_device_s"]
    for name, fields in EVALUATION_VARIANTS.items():
        run = TrainingRun(ExperimentConfig.from_dict(
            {**config, "train": {**config["train"], **fields}}))  # fmt: skip
        run.load_state_dict(state)
        seconds = fastest(run.evaluate)
        ours = run.evaluate().metrics
        finite = [key for key, value in metrics.items() if math.isfinite(value + ours[key])]
        difference = max(
            (abs(ours[key] - metrics[key]) / max(abs(metrics[key]), 1e-12) for key in finite),
            default=0.0,
        )
        how = "graphed" if isinstance(run.eval_forward, GraphedForward) else "eager"
        ctx.row(f"{label}: validation pass, {name} / the trial's", seconds / device, "x",
                f"{seconds:.3f} s against {device:.3f} s on the trial's final state (its forward "
                f"{how}); its metrics differ from the trial's pass by at most {difference:.2g} "
                "relative", target="< 1.0 would favour it on a GPU")  # fmt: skip


def summary(measured: dict) -> dict[str, float]:
    """Means over the epochs and the train shares: measured (the device path, the sweep's
    checkpoint cadence), and before (the host evaluation instead, and a checkpoint after
    every epoch), from the same run's figures."""
    epochs = measured["epochs"]
    means = {part: sum(epoch[part] for epoch in epochs) / len(epochs) for part in PARTS}
    span = sum(epoch["span"] for epoch in epochs) / len(epochs)
    without = span - means["evaluate"] - means["checkpoint"]  # train, audit, rest
    checkpoint = measured["checkpoint_write_s"]
    before = without + measured["evaluate_host_s"] + checkpoint
    every_epoch = checkpoint / (without + means["evaluate"] + checkpoint)
    return {**{f"{part}_s": value for part, value in means.items()}, "span_s": span,
            "train_share": means["train"] / span, "train_share_before": means["train"] / before,
            "checkpoint_share_every_epoch": every_epoch}  # fmt: skip


def epoch_detail(parts: dict, suffix: str = "") -> str:
    return ", ".join(f"{name} {parts[name + suffix]:.3f}" for name in PARTS)


def breakdown_suite(ctx: Context) -> None:
    """The demo's size (and without --quick a larger one) on a CPU, the paper's on a GPU."""
    names = {"toy": ["toy"], "demo": ["demo"], "real": ["demo", "larger"]}[ctx.size]
    for size in [BREAKDOWN_SIZES[n] for n in (["real"] if ctx.cuda else names)]:
        with ctx.step(f"trial breakdown, {size.name}"):
            breakdown_rows(ctx, size)


def breakdown_rows(ctx: Context, size: BreakdownSize) -> None:
    workdir = ctx.workdir / f"breakdown-{size.name}"
    root = real_data(ctx) if size.name in ("toy", "real") else workdir / f"data-{size.name}"
    if not root.exists():
        write_synthetic_nyuv2(root, train=size.train, val=size.val, height=size.height,
                              width=size.width, seed=0)  # fmt: skip
    start = time.perf_counter()
    trial_dir, label = run_trial(size, root, workdir, ctx.cuda), f"trial breakdown, {size.name}"
    print(f"the trial took {time.perf_counter() - start:.1f} s with Ray's start", flush=True)
    epochs = epoch_parts(trial_dir, workdir / "timing")
    devices = trained_on(ctx, [epoch["device"] for epoch in epochs], label)
    for index, epoch in enumerate(epochs):  # kept if the suite is killed in before_and_after
        name = f"{label}, epoch {index + 1}: train share"
        ctx.row(name, epoch["train_share"], "", epoch_detail(epoch))
    measured = {"epochs": epochs, **before_and_after(trial_dir, workdir)}
    totals = summary(measured)
    where = (f"{size.backbone} {size.height}x{size.width}, {size.train} train / {size.val} val "
             f"images, batch 8, {len(measured['epochs'])} epochs, ERM, "
             f"{'GPU fast path' if ctx.cuda else 'CPU, 1 thread'}, {devices}")  # fmt: skip
    share, before = totals["train_share"], totals["train_share_before"]
    ctx.judged("train share of a trial's epochs" + ("" if ctx.cuda else ", CPU"),
               f"{label}: train share of the epochs", share, "", f"{where}; mean seconds per "
               f"epoch: {epoch_detail(totals, '_s')}; before (the host evaluation path): "
               f"{before:.3f}", reference=before)  # fmt: skip
    host, device = measured["evaluate_host_s"], measured["evaluate_device_s"]
    ctx.judged("validation pass, device / host path", f"{label}: validation pass, device path / "
               f"host path", device / host, "x", f"{device:.3f} s against {host:.3f} s, the same "
               f"model ({size.val} images), the faster of 2 after a warm-up; host path: "
               "relif_ray.testing.host_evaluation")  # fmt: skip
    ctx.row(f"{label}: one checkpoint", measured["checkpoint_write_s"], "s",
            f"{measured['checkpoint_mb']:.0f} MB (weights, Adam's moments, ReLiF and RNG state) "
            "saved and copied once, as Tune persists it; after every epoch it would take "
            f"{totals['checkpoint_share_every_epoch']:.1%} of the epoch; the sweep's cadence "
            "keeps checkpoints at most 5% of a trial's time")  # fmt: skip
    evaluation_variant_rows(ctx, label, measured)
