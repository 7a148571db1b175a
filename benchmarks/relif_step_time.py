"""Step time of ERM + ReLiF over ERM on the dense NYUv2 model (issue 3; target <= 1.05).

Both runs are real `TrainingRun`s (same model, data and batch size) on in-memory synthetic
NYUv2 scenes. Steps are timed interleaved, one step of each per round in alternating order,
so machine noise hits both alike; the ratio is the median over rounds of the per-round ratio.

    python benchmarks/relif_step_time.py --quick        # CPU, resnet18 at 96x128, ~1 minute
    python benchmarks/relif_step_time.py --backbone resnet50 --height 288 --width 384 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from relif_ray.config import ExperimentConfig
from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
from relif_ray.engine import TrainingRun

TARGET = 1.05


def _run(root: str, args: argparse.Namespace, relif: bool) -> TrainingRun:
    config = {
        "device": args.device,
        "data": {"dataset": "nyuv2", "root": root},
        "model": {"backbone": args.backbone},
        "train": {"epochs": 1000, "batch_size": args.batch_size, "lr": 1e-4},
        "relif": {"enabled": relif, "warmup_steps": 0},
    }
    return TrainingRun(ExperimentConfig.from_dict(config))


def _timed_step(run: TrainingRun) -> float:
    if run.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    run.train_steps(1)
    if run.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(args: argparse.Namespace) -> dict[str, float]:
    """Median seconds per step of both runs and the median per-round ratio."""
    with tempfile.TemporaryDirectory() as tmp:
        root = str(
            write_synthetic_nyuv2(
                f"{tmp}/nyuv2",
                train=4 * args.batch_size,
                val=2,
                height=args.height,
                width=args.width,
                seed=0,
            )
        )
        erm, relif = _run(root, args, relif=False), _run(root, args, relif=True)
        for _ in range(args.warmup):
            _timed_step(erm), _timed_step(relif)
        erm_times, relif_times, ratios = [], [], []
        for index in range(args.rounds):
            order = (erm, relif) if index % 2 == 0 else (relif, erm)
            times = {id(run): _timed_step(run) for run in order}
            erm_times.append(times[id(erm)])
            relif_times.append(times[id(relif)])
            ratios.append(times[id(relif)] / times[id(erm)])
    return {
        "erm_step_s": statistics.median(erm_times),
        "relif_step_s": statistics.median(relif_times),
        "ratio": statistics.median(ratios),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds (about a minute on CPU)")
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--height", type=int, default=96)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    if args.quick:
        args.rounds = 10
    result = measure(args)
    verdict = "pass" if result["ratio"] <= TARGET else "FAIL"
    erm_ms, relif_ms = result["erm_step_s"] * 1e3, result["relif_step_s"] * 1e3
    print(
        f"ERM {erm_ms:.1f} ms/step, ERM+ReLiF {relif_ms:.1f} ms/step, "
        f"ratio {result['ratio']:.3f} (target <= {TARGET}) {verdict}"
    )


if __name__ == "__main__":
    main()
