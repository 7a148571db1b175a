"""What fusing seeds saves (`train.fused_seeds`): the same sweep of S seeds run as S separate
trials per setting and as one fused trial per setting, timed in one run, alternating, on an
otherwise idle machine.

    python -m benchmarks.run --only fused              # the rows below at their real size
    python -m benchmarks.run --only fused --size demo  # shorter budgets, once
    python -m benchmarks.run --only fused-demo         # what the saving buys the eICU demo

The figure the targets judge is trial-seconds per seed: the sum over the sweep's Tune trials
of each trial's seconds from its set-up to its last outputs (its `trial.json`'s started_at and
finished_at), divided by the seeds it trained: what a seed costs the machine's trial slots.
The sweep's wall seconds per seed are reported beside it: on 2 cores the separate trials run
two at a time, while a fused ReLiF trial waits for the fused ERM trial that gives its squash
constants, so the wall clock gains less than the slots do. Each sweep is `--methods
erm,relif` at the benchmark's defaults (ACTG 175's preset; the clinical LSTM's and NYUv2's
demo budgets, the demo's model), and how it is fused is its config's `fused_form`: the
tabular MLP and the clinical LSTM stacked, NYUv2's ResNet looped.

The GPU rows (`fused_gpu_suite`, in the GPU check: `benchmarks/gpu_check.py`): ERM at the
paper's size (ResNet-50, 288x384, batch 8, the GPU fast path, graphed) as one isolated
trial's worker and as fused workers of 2, 4 and 8 seeds (streamed: each seed's graphed step
on a CUDA stream of its own, `relif_ray.fused`): the aggregate training images/s per GPU
against the isolated rate (target >= 2x), and the peak GPU memory per seed. The smallest S
that passes is the one a `--num-gpus` sweep should fuse; until a GPU has measured the rows,
`--fused-seeds` stays 1 there. The check's dry run runs them at toy size on the CPU.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import OUT_OF_TIME, Context
from benchmarks.targets import TARGETS
from benchmarks.throughput import warm_up_gpu
from benchmarks.workers import data_root, setting_text, timed_worker, trial_config, worker_rows
from relif_ray.experiment.record import CUDA_PEAK_MB
from relif_ray.problems.mimic3 import CLINICAL_DEMO

REPO = Path(__file__).resolve().parents[1]
METHODS = "erm,relif"


@dataclass(frozen=True)
class FusedRow:
    """One benchmark's sweep: its command (without seeds, storage and name) and, per size,
    (seeds, budget flags, repeats)."""

    name: str
    command: tuple[str, ...]
    sizes: dict[str, tuple[int, tuple[str, ...], int]]


ROWS = (
    FusedRow(
        "ACTG 175 trial-seconds per seed, separate / fused",
        ("sweeps/tabular.py", "--preset", "actg175"),
        {"toy": (2, ("--epochs", "2"), 1), "demo": (10, ("--epochs", "20"), 1),
         "real": (10, (), 2)},
    ),
    FusedRow(
        "clinical LSTM trial-seconds per seed, separate / fused",
        ("sweeps/clinical.py", "--demo", "--dataset", "eicu"),
        {"toy": (2, ("--steps", "4"), 1), "demo": (10, ("--steps", "50"), 1),
         "real": (10, (), 1)},
    ),
    FusedRow(
        "NYUv2 demo trial-seconds per seed, separate / fused",
        ("sweeps/nyuv2.py", "--demo"),
        {"toy": (2, ("--steps", "2"), 1), "demo": (4, ("--steps", "40"), 1),
         "real": (4, (), 1)},
    ),
)  # fmt: skip
"""The rows: 10 seeds where a target judges them; NYUv2 (compute-bound on a CPU, no target)
at 4 seeds of its demo, which on 2 cores already takes minutes per form."""


DEMO = FusedRow(
    "clinical demo wall seconds, twice its seeds fused / its seeds separate",
    ("sweeps/clinical.py", "--demo", "--dataset", "eicu"),
    {"toy": (1, ("--steps", "4"), 1), "demo": (CLINICAL_DEMO["seeds"], ("--steps", "50"), 1),
     "real": (CLINICAL_DEMO["seeds"], (), 1)},
)  # fmt: skip
"""What the saving buys: the eICU demo's own sweep (its seeds, `CLINICAL_DEMO`, as separate
trials) against twice as many seeds fused in one trial per setting, each on the wall clock."""


def fused_suite(ctx: Context) -> None:
    """Each benchmark's sweep as separate and as fused trials, alternating."""
    for row in ROWS:
        seeds, budget, repeats = row.sizes[ctx.size]
        load = os.getloadavg()[0]
        storage = ctx.workdir / "fused"
        per_seed = measure(row.command, storage, seeds, list(budget), repeats)
        ratio = per_seed["separate"]["trial_s"] / per_seed["fused"]["trial_s"]
        wall = per_seed["separate"]["wall_s"] / per_seed["fused"]["wall_s"]
        detail = (
            f"{seeds} seeds x {METHODS}, median of {repeats}; per seed: separate "
            f"{per_seed['separate']['trial_s']:.2f} s, fused {per_seed['fused']['trial_s']:.2f} s"
            f" of trial time; sweep wall per seed {wall:.2f}x; load {load:.2f} -> "
            f"{os.getloadavg()[0]:.2f}"
        )
        target = TARGETS.get(row.name)
        judged = target is not None and ctx.size == "real"
        ctx.row(row.name, ratio, "x", detail, target=target.text if target else "-",
                result=target.judge(ratio) if judged else "info")  # fmt: skip


def fused_demo_suite(ctx: Context) -> None:
    """The demo's seeds as separate trials against twice as many fused: the sweeps' wall
    seconds (a ratio below 1: the fused sweep trains twice the seeds in less time)."""
    seeds, budget, _ = DEMO.sizes[ctx.size]
    storage, walls = ctx.workdir / "fused", {}
    for form, count, fused in (("separate", seeds, 1), ("fused", 2 * seeds, 2 * seeds)):
        name = f"demo-{form}"
        shutil.rmtree(storage / name, ignore_errors=True)
        flags = [*DEMO.command, *sweep_flags(name, storage, count, fused), *budget]
        walls[form] = timed(flags, storage / f"{name}.log")
    ctx.row(DEMO.name, walls["fused"] / walls["separate"], "x",
            f"{seeds} seeds x {METHODS} separate: {walls['separate']:.0f} s; {2 * seeds} seeds "
            f"fused: {walls['fused']:.0f} s (each sweep's wall clock, its start included)",
            )  # fmt: skip


GPU_FUSED_SEEDS = (2, 4, 8)
"""The fused workers of the GPU rows, after the isolated trial's."""
GPU_RATE_TARGET = "fused images/s per GPU / isolated graphed ERM"


def fused_gpu_suite(ctx: Context) -> None:
    """The isolated ERM worker, then fused workers of 2, 4 and 8 seeds: each one's images/s
    (every seed's images), its peak GPU memory per seed, and its rate over the isolated one."""
    if ctx.cuda:
        warm_up_gpu(ctx.device)  # the first worker timed would meet idle clocks
    root, isolated = data_root(ctx, gpu=True), None
    for seeds in (1, *GPU_FUSED_SEEDS):
        name = "erm, isolated trial" if seeds == 1 else f"erm, {seeds} seeds fused"
        if not ctx.has_time(20 + 5 * seeds):
            ctx.skip(f"training images/s, {name}", OUT_OF_TIME)
            continue
        with ctx.step(f"training images/s, {name}"):
            config = trial_config(ctx, root, "erm", gpu=True)
            config["train"]["fused_seeds"] = seeds
            result = timed_worker(ctx, config)
            setting = setting_text(config, root)
            worker_rows(ctx, name, result, setting)
            peak = result[CUDA_PEAK_MB]
            ctx.row(f"peak GPU memory per seed, {name}", peak / seeds if peak else None, "MiB",
                    f"{setting}; the worker's peak over its {seeds} seed(s)",
                    result="info" if peak else "needs a GPU")  # fmt: skip
            rate = result["images_per_s"]
            if seeds == 1:
                isolated = rate
            elif isolated:
                target = TARGETS[GPU_RATE_TARGET]
                judged = ctx.cuda and ctx.size == "real"
                ctx.row(f"images/s per GPU, {seeds} seeds fused / isolated", rate / isolated,
                        "x", f"{setting}; {result['steps_as']}; every seed's images over the "
                        "isolated graphed ERM trial's", target=target.text,
                        result=target.judge(rate / isolated) if judged else "info")  # fmt: skip


def measure(
    command: tuple[str, ...], storage: Path, seeds: int, budget: list[str], repeats: int
) -> dict[str, dict[str, float]]:
    """Alternate the separate and the fused sweep `repeats` times; the median per seed of the
    trial seconds and of the sweep's wall seconds of each form."""
    runs: dict[str, list[dict[str, float]]] = {"separate": [], "fused": []}
    for repeat in range(repeats):
        for form, fused in (("separate", 1), ("fused", seeds)):
            name = f"{Path(command[0]).stem}-{form}-{repeat}"
            shutil.rmtree(storage / name, ignore_errors=True)
            flags = [*command, *sweep_flags(name, storage, seeds, fused), *budget]
            wall = timed(flags, storage / f"{name}.log")
            slots, trained = trial_seconds(storage / name)
            runs[form].append({"wall_s": wall / trained, "trial_s": slots / trained})
    return {
        form: {key: statistics.median(run[key] for run in rows) for key in ("trial_s", "wall_s")}
        for form, rows in runs.items()
    }


def sweep_flags(name: str, storage: Path, seeds: int, fused: int) -> list[str]:
    return [
        "--name", name, "--num-cpus", "2", "--storage", str(storage), "--methods", METHODS,
        "--seeds", str(seeds), "--fused-seeds", str(fused),
    ]  # fmt: skip


def timed(command: list[str], log: Path) -> float:
    """Wall seconds of `command` (python arguments, from the repository); a failure stops the
    suite with the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run([sys.executable, *command], cwd=REPO, stdout=out, stderr=out)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited {done.returncode}: {log.read_text()[-2000:]}"
        )
    return time.perf_counter() - start


def trial_seconds(experiment: Path) -> tuple[float, int]:
    """(the sum of every Tune trial's seconds from set-up to its last outputs, the seeds they
    trained), from each trial's newest outputs (a fused trial's: its seeds' records)."""
    from relif_ray.experiment.outputs import read_trial_record
    from relif_ray.experiment.record import FusedTrialRecord

    total, seeds = 0.0, 0
    for trial in sorted(path for path in experiment.iterdir() if path.is_dir()):
        outputs = sorted(trial.glob("checkpoint_*/outputs"))
        if not outputs:
            continue
        record = read_trial_record(str(outputs[-1]))
        folders = [outputs[-1]]
        if isinstance(record, FusedTrialRecord):
            folders = [outputs[-1] / folder for folder in record.seed_folders.values()]
        records = [read_trial_record(str(folder)) for folder in folders]
        total += max(r.finished_at for r in records) - min(r.started_at for r in records)
        seeds += len(records)
    return total, seeds
