"""What fusing seeds saves (`train.fused_seeds`): the same sweep of S seeds run as S separate
trials per setting and as one fused trial per setting, timed in one run, alternating, on an
otherwise idle machine.

    python -m benchmarks.run --only fused              # 10 seeds, the preset's 100 epochs, twice
    python -m benchmarks.run --only fused --size demo  # 10 seeds, 20 epochs, once

The figure the target judges is trial-seconds per seed: the sum over the sweep's Tune trials of
each trial's seconds from its set-up to its last outputs (its `trial.json`'s started_at and
finished_at), divided by the seeds it trained: what a seed costs the machine's trial slots.
The sweep's wall seconds per seed are reported beside it: on 2 cores the separate trials run
two at a time, while a fused ReLiF trial waits for the fused ERM trial that gives its squash
constants, so the wall clock gains less than the slots do. Each sweep is the preset's
`--methods erm,relif` at its defaults; the two forms train the same numbers (tests/test_fused.py
holds them bit for bit), so only the time differs. A benchmark whose model is not fused (the
clinical LSTM, NYUv2) is recorded with the sweep's one-line refusal.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import Context
from benchmarks.targets import TARGETS

REPO = Path(__file__).resolve().parents[1]
METHODS = "erm,relif"
RATIO_ROW = "ACTG 175 trial-seconds per seed, separate / fused"
SIZES = {"toy": (2, ["--epochs", "2"], 1), "demo": (10, ["--epochs", "20"], 1), "real": (10, [], 2)}
"""size -> (seeds, budget flags, repeats); the target holds at the real size (the preset's
defaults)."""
NOT_FUSED = {
    "clinical LSTM trial-seconds per seed, separate / fused": [
        "sweeps/clinical.py", "--demo", "--dataset", "eicu"
    ],
    "NYUv2 demo trial-seconds per seed, separate / fused": ["sweeps/nyuv2.py", "--demo"],
}  # fmt: skip
"""The benchmarks whose model is not fused: the sweep each would run, fused."""


def fused_suite(ctx: Context) -> None:
    """ACTG 175's sweep as separate and as fused trials, alternating; the benchmarks that are
    not fused, with the sweep's refusal."""
    seeds, budget, repeats = SIZES[ctx.size]
    load = os.getloadavg()[0]
    per_seed = measure("actg175", ctx.workdir / "fused", seeds, budget, repeats)
    ratio = per_seed["separate"]["trial_s"] / per_seed["fused"]["trial_s"]
    wall = per_seed["separate"]["wall_s"] / per_seed["fused"]["wall_s"]
    target = TARGETS[RATIO_ROW]
    detail = (
        f"{seeds} seeds x {METHODS}, median of {repeats}; per seed: separate "
        f"{per_seed['separate']['trial_s']:.2f} s, fused {per_seed['fused']['trial_s']:.2f} s of "
        f"trial time; sweep wall per seed {wall:.2f}x; load {load:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    real = ctx.size == "real"
    ctx.row(RATIO_ROW, ratio, "x", detail, target=target.text,
            result=target.judge(ratio) if real else "info")  # fmt: skip
    for name, command in NOT_FUSED.items():
        target = TARGETS.get(name)
        ctx.row(name, None, "x", refusal(command, ctx.workdir),
                target=target.text if target else "-",
                result="FAIL" if target else "info")  # fmt: skip


def measure(
    preset: str, storage: Path, seeds: int, budget: list[str], repeats: int
) -> dict[str, dict[str, float]]:
    """Alternate the separate and the fused sweep `repeats` times; the median per seed of the
    trial seconds and of the sweep's wall seconds of each form."""
    runs: dict[str, list[dict[str, float]]] = {"separate": [], "fused": []}
    for repeat in range(repeats):
        for form, fused in (("separate", 1), ("fused", seeds)):
            name = f"{preset}-{form}-{repeat}"
            shutil.rmtree(storage / name, ignore_errors=True)
            flags = [*sweep(preset, name, storage, seeds, fused), *budget]
            wall = timed(flags, storage / f"{name}.log")
            slots, trained = trial_seconds(storage / name)
            runs[form].append({"wall_s": wall / trained, "trial_s": slots / trained})
    return {
        form: {key: statistics.median(run[key] for run in rows) for key in ("trial_s", "wall_s")}
        for form, rows in runs.items()
    }


def sweep(preset: str, name: str, storage: Path, seeds: int, fused: int) -> list[str]:
    return [
        "sweeps/tabular.py", "--preset", preset, "--name", name, "--num-cpus", "2",
        "--storage", str(storage), "--methods", METHODS, "--seeds", str(seeds),
        "--fused-seeds", str(fused),
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


def refusal(command: list[str], workdir: Path) -> str:
    """The one line a fused sweep of a benchmark that is not fused exits with."""
    flags = [*command, "--fused-seeds", "2", "--storage", str(workdir / "refused")]
    done = subprocess.run([sys.executable, *flags], cwd=REPO, capture_output=True, text=True)
    lines = done.stderr.strip().splitlines()
    return f"not fused: exit {done.returncode}, {lines[-1] if lines else ''}"
