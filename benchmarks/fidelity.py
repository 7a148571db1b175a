"""Fidelity: does ReLiF cut the fixed-delta Bias of a multi-task model at equal utility?

    python benchmarks/fidelity.py                 # about 15 minutes on 2 CPU cores
    python benchmarks/fidelity.py --json          # the same rows as JSON, with the machine
    python benchmarks/fidelity.py --quick         # a smoke run: tiny data, 1 seed, 3 labels
    python benchmarks/run.py --only fidelity      # the same rows through the suite's runner

Not part of `benchmarks/run.py`'s default run. Everything goes through the real code: synthetic
NYUv2 from `relif make-data`'s writer, one `sweeps/nyuv2.py` sweep (ERM, ReLiF with the paper's
ERM squash and with the running squash, the three ablations and PCGrad + ReLiF; resnet18; the
controller scaled to the step budget by `scale_to_budget`), then `relif report`, whose
`per_trial.csv` gives every figure. Each ReLiF label is compared with the same-seed ERM trial:

- Bias@delta_p75 ratio (label / ERM; target <= 0.5 for the default ReLiF, paper Table 1 shows
  0.0062 / 0.2141), next to the share of depth and normal audit scores clipped at 0 and at 1
  (ERM's is about 0.1 each side by construction of the squash);
- VR@delta_p75 ratio;
- Worst and Macro differences (label - ERM; target >= -0.02 for the default ReLiF).

A verdict is on the mean over seeds; every row also carries its per-seed values.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rows import Row, emit, machine
from timing import verdict

from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
from relif_ray.relif.controller import scale_to_budget

REPO = Path(__file__).resolve().parents[1]
REFERENCE = "erm"
DEFAULT_RELIF = "relif"
LABELS = (
    "relif",
    "relif-running",
    "relif-noalign",
    "relif-static",
    "relif-nolip",
    "pcgrad+relif",
)
"""Every ReLiF label compared with ERM: the default (paper's ERM squash), the running squash,
the three ablations and one hybrid."""
BIAS_RATIO_TARGET = 0.5
UTILITY_DROP_TARGET = -0.02
AUDITED_TASKS = ("depth", "normal")
"""The regression tasks whose scores the squash clips (NYUv2's segmentation score is bounded)."""


@dataclass(frozen=True)
class Size:
    """Data and budget of one fidelity run."""

    train: int
    val: int
    height: int
    width: int
    seeds: int
    steps: int
    labels: tuple[str, ...]


FULL = Size(train=160, val=64, height=48, width=64, seeds=3, steps=80, labels=LABELS)
"""80 steps (4 epochs): measured on the 2 shared cores at load 7-10, two concurrent trials ran
1.35 s per step each (validation audit included), i.e. 0.65 s per trial step; 21 trials x 80
steps x 0.65 s is about 15 minutes, plus Ray start and the report. The full run took 862 s
at load 8.7 (7.5 at the end)."""
QUICK = Size(train=16, val=8, height=48, width=64, seeds=1, steps=4, labels=LABELS[:2])
BATCH_SIZE = 8
LEARNING_RATE = 1e-3
"""resnet18, batch 8, Adam lr 1e-3: the NYUv2 demo's training settings."""


def run_sweep(size: Size, workdir: Path) -> Path:
    """Write the data, run the sweep through `sweeps/nyuv2.py`; the experiment directory."""
    data = workdir / "data"
    write_synthetic_nyuv2(
        data, train=size.train, val=size.val, height=size.height, width=size.width, seed=0
    )
    eta, warmup = scale_to_budget(size.steps)
    command = [
        sys.executable,
        str(REPO / "sweeps" / "nyuv2.py"),
        *("--data-dir", str(data), "--methods", ",".join((REFERENCE, *size.labels))),
        *("--seeds", str(size.seeds), "--steps", str(size.steps), "--backbone", "resnet18"),
        *("--batch-size", str(BATCH_SIZE), "--lr", f"{LEARNING_RATE:g}"),
        *("--eta", f"{eta:g}", "--warmup-steps", str(warmup)),
        *("--storage", str(workdir / "results"), "--name", "fidelity", "--num-cpus", "2"),
    ]
    run_command(command)
    return workdir / "results" / "fidelity"


def run_report(experiment: Path, out: Path) -> pd.DataFrame:
    """`relif report EXPERIMENT --out OUT`; its per-trial numbers."""
    run_command(
        [sys.executable, "-m", "relif_ray.cli", "report", str(experiment), "--out", str(out)]
    )
    return pd.read_csv(out / "per_trial.csv")


def run_command(command: list[str]) -> None:
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} failed:\n{result.stderr[-3000:]}")


def per_seed(trials: pd.DataFrame, label: str, column: str) -> dict[int, float]:
    """Seed -> the `column` value of that seed's `label` trial."""
    rows = trials[trials["label"] == label].set_index("seed")[column]
    if not rows.index.is_unique:
        raise ValueError(f"per_trial.csv: more than one '{label}' trial for a seed")
    return {int(seed): float(value) for seed, value in rows.items()}


def compare(trials: pd.DataFrame, label: str, column: str, ratio: bool) -> dict[int, float]:
    """Seed -> label / ERM (`ratio`) or label - ERM of `column`, over seeds both ran."""
    variant, reference = per_seed(trials, label, column), per_seed(trials, REFERENCE, column)
    seeds = sorted(set(variant) & set(reference))
    if ratio:
        return {s: variant[s] / reference[s] for s in seeds}
    return {s: variant[s] - reference[s] for s in seeds}


def clipped_shares(trials: pd.DataFrame, label: str) -> dict[str, float]:
    """`clip<side>_<task>` -> mean over seeds of the share of audit scores clipped there."""
    return {
        f"clip{side}_{task}": statistics.mean(
            per_seed(trials, label, f"clip{side}_{task}").values()
        )
        for side in (0, 1)
        for task in AUDITED_TASKS
    }


def seeds_text(values: dict[int, float]) -> str:
    return ", ".join(f"seed {seed} {value:.3f}" for seed, value in values.items())


def label_rows(trials: pd.DataFrame, label: str) -> list[Row]:
    """The Bias, clipping, VR, Worst and Macro rows of one ReLiF label against ERM."""
    judged = label == DEFAULT_RELIF
    rows = []
    bias = compare(trials, label, "bias_p75", ratio=True)
    mean = statistics.mean(bias.values())
    rows.append(
        Row(
            "fidelity",
            f"Bias@delta_p75 {label} / ERM",
            mean,
            "x",
            f"<= {BIAS_RATIO_TARGET}" if judged else "-",
            verdict(mean <= BIAS_RATIO_TARGET) if judged else "info",
            seeds_text(bias),
            bias,
        )
    )
    shares, reference = clipped_shares(trials, label), clipped_shares(trials, REFERENCE)
    clip_per_seed = {
        seed: statistics.mean(per_seed(trials, label, key)[seed] for key in shares) for seed in bias
    }
    rows.append(
        Row(
            "fidelity",
            f"clipped audit scores, {label}",
            statistics.mean(clip_per_seed.values()),
            "",
            "-",
            "info",
            "; ".join(f"{key} {shares[key]:.2f} (ERM {reference[key]:.2f})" for key in shares),
            clip_per_seed,
        )
    )
    vr = compare(trials, label, "vr_p75", ratio=True)
    rows.append(
        Row(
            "fidelity",
            f"VR@delta_p75 {label} / ERM",
            statistics.mean(vr.values()),
            "x",
            "-",
            "info",
            seeds_text(vr),
            vr,
        )
    )
    for metric in ("worst", "macro"):
        difference = compare(trials, label, metric, ratio=False)
        mean = statistics.mean(difference.values())
        rows.append(
            Row(
                "fidelity",
                f"{metric.capitalize()} {label} - ERM",
                mean,
                "",
                f">= {UTILITY_DROP_TARGET}" if judged else "-",
                verdict(mean >= UTILITY_DROP_TARGET) if judged else "info",
                seeds_text(difference),
                difference,
            )
        )
    return rows


def fidelity_rows(size: Size, workdir: Path) -> list[Row]:
    """Sweep, report, and every label's rows against the same-seed ERM trial."""
    experiment = run_sweep(size, workdir)
    trials = run_report(experiment, workdir / "report")
    eta, warmup = scale_to_budget(size.steps)
    setting = (
        f"synthetic NYUv2 {size.train} train / {size.val} val at {size.height}x{size.width}, "
        f"resnet18, {size.steps} steps, eta {eta:g}, warmup {warmup}, {size.seeds} seed(s)"
    )
    rows = [Row("fidelity", "setting", None, "", "-", "info", setting)]
    for label in size.labels:
        rows += label_rows(trials, label)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny data, 1 seed")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--steps", type=int, help=f"steps per trial (default: {FULL.steps}; --quick: {QUICK.steps})"
    )
    args = parser.parse_args(argv)
    size = QUICK if args.quick else FULL
    if args.steps is not None:
        if args.steps <= 0:
            parser.error(f"--steps must be positive, got {args.steps}")
        size = dataclasses.replace(size, steps=args.steps)
    info = machine_info()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rows = fidelity_rows(size, Path(tmp))
    info["wall_s"] = round(time.perf_counter() - start)
    info["load_average_end"] = os.getloadavg()[0]
    return emit(rows, info, args.quick, args.json)


def machine_info() -> dict[str, object]:
    import torch

    return machine(torch.device("cpu"))


if __name__ == "__main__":
    raise SystemExit(main())
