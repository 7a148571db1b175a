"""Step time of ERM + ReLiF over ERM, dense NYUv2 model and clinical LSTM (target <= 1.05).

Both runs are real `TrainingRun`s (same model, data, batch size and train settings) on
synthetic data in the real on-disk layouts: NYUv2 scenes for the dense model, MIMIC-III
multitask stays for the LSTM (the paper's 2-layer LSTM, hidden 256). Steps are timed
interleaved, one step of each per round in shuffled order, so machine noise hits both alike;
the ratio is the median over rounds of the per-round ratio, with a ~95% interval.

    python benchmarks/relif_step_time.py --quick                   # CPU, dense, ~1 minute
    python benchmarks/relif_step_time.py --model lstm --quick      # CPU, clinical LSTM
    python benchmarks/relif_step_time.py --backbone resnet50 --height 288 --width 384 \\
        --device cuda --precision bf16 --channels-last
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass, field
from typing import Literal

import torch
from timing import TIMING_SQUASH_BAND, interleaved_times, ratio_with_interval, verdict_at_most

from relif_ray.config import ExperimentConfig
from relif_ray.data.synthetic_mimic3 import write_synthetic_mimic3
from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
from relif_ray.engine import TrainingRun

TARGET = 1.05
Model = Literal["dense", "lstm"]


@dataclass
class Setting:
    """What is timed. Sizes: the dense defaults are a CPU-sized stand-in for the paper's
    ResNet-50 at 288x384; the LSTM is the paper's (2 layers, hidden 256, batch 64)."""

    model: Model = "dense"
    device: str = "cpu"
    rounds: int = 40
    warmup: int = 3
    batch_size: int | None = None
    backbone: str = "resnet18"
    height: int = 96
    width: int = 128
    patients: int = 120
    train: dict = field(default_factory=dict)


def _write_data(setting: Setting, folder: str) -> tuple[str, str]:
    """(data set name, root) of synthetic data with at least 4 batches of training examples."""
    if setting.model == "lstm":
        root = write_synthetic_mimic3(f"{folder}/mimic3", patients=setting.patients, seed=0)
        return "mimic3", str(root)
    root = write_synthetic_nyuv2(
        f"{folder}/nyuv2",
        train=4 * _batch_size(setting),
        val=2,
        height=setting.height,
        width=setting.width,
        seed=0,
    )
    return "nyuv2", str(root)


def _batch_size(setting: Setting) -> int:
    return setting.batch_size or (64 if setting.model == "lstm" else 8)


def _run(setting: Setting, dataset: str, root: str, relif: bool) -> TrainingRun:
    model = (
        {"hidden_size": 256, "num_layers": 2}
        if setting.model == "lstm"
        else {"backbone": setting.backbone, "head_channels": 128}
    )
    config = {
        "device": setting.device,
        "data": {"dataset": dataset, "root": root},
        "model": model,
        "train": {"epochs": 1000, "batch_size": _batch_size(setting), **setting.train},
        "relif": {"enabled": relif, "warmup_steps": 0, "squash_constants": TIMING_SQUASH_BAND},
    }
    return TrainingRun(ExperimentConfig.from_dict(config))


def measure(setting: Setting) -> dict[str, float]:
    """Median seconds per step of both runs, the median per-round ratio and its interval."""
    with tempfile.TemporaryDirectory() as tmp:
        dataset, root = _write_data(setting, tmp)
        runs = {
            "erm": _run(setting, dataset, root, relif=False),
            "relif": _run(setting, dataset, root, relif=True),
        }
    steps = {name: (lambda run=run: run.train_steps(1)) for name, run in runs.items()}
    cuda = runs["erm"].device.type == "cuda"
    times = interleaved_times(steps, setting.rounds, setting.warmup, cuda)
    ratio, lower, upper = ratio_with_interval(times, "relif", "erm")
    return {
        "erm_step_s": statistics.median(times["erm"]),
        "relif_step_s": statistics.median(times["relif"]),
        "ratio": ratio,
        "ratio_low": lower,
        "ratio_high": upper,
        "batch_size": float(_batch_size(setting)),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 rounds (about a minute on CPU)")
    parser.add_argument("--model", choices=["dense", "lstm"], default="dense")
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--height", type=int, default=96)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=None, help="8 dense, 64 LSTM")
    parser.add_argument("--patients", type=int, default=120, help="synthetic MIMIC-III size")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    setting = Setting(
        model=args.model,
        device=args.device,
        rounds=10 if args.quick else args.rounds,
        warmup=args.warmup,
        batch_size=args.batch_size,
        backbone=args.backbone,
        height=args.height,
        width=args.width,
        patients=args.patients,
        train={"precision": args.precision, "channels_last": args.channels_last},
    )
    result = measure(setting)
    verdict = verdict_at_most(result["ratio"], result["ratio_low"], TARGET)
    print(
        f"{args.model}: ERM {result['erm_step_s'] * 1e3:.1f} ms/step, ERM+ReLiF "
        f"{result['relif_step_s'] * 1e3:.1f} ms/step, ratio {result['ratio']:.3f} "
        f"[{result['ratio_low']:.3f}, {result['ratio_high']:.3f}] (target <= {TARGET}) {verdict}"
    )


if __name__ == "__main__":
    main()
