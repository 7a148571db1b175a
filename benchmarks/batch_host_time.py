"""Host time of taking one training batch: the host path against `train.data_on_device`.

A GPU step whose host work outlasts its GPU work leaves the GPU idle, and on the host path
every step gathers its batch from the in-memory split on the host and copies it into pinned
memory before the asynchronous copy to the GPU. With `train.data_on_device` the split and the
epoch's permutation are on the GPU and the host only launches the gathers. Both are timed here
on the CPU, interleaved (`timing.interleaved_times`), on NYUv2-shaped data (288x384, batch 8):

- host path: `TensorSplit.batch` on the host plus one copy of the batch (standing in for the
  copy into pinned memory, which needs a GPU driver);
- on the device: the same gathers with the split and the permutation on PyTorch's "meta"
  device, which computes nothing, so what is timed is the host's share alone (dispatching
  the gathers; a GPU adds its launch cost, a few microseconds per gather).

    python benchmarks/batch_host_time.py          # ~1.3 GB of memory for 128 examples
"""

from __future__ import annotations

import argparse
import statistics

import torch
from timing import interleaved_times, ratio_with_interval

from relif_ray.data.splits import TensorSplit
from relif_ray.transfer import resident_split

SHAPES = {"image": (3, 288, 384), "depth": (1, 288, 384), "normal": (3, 288, 384)}
"""NYUv2's float32 entries per example (labels are int8: `seg`)."""


def nyuv2_shaped_split(examples: int) -> TensorSplit:
    tensors = {key: torch.rand(examples, *shape) for key, shape in SHAPES.items()}
    tensors["seg"] = torch.randint(-1, 13, (examples, 288, 384), dtype=torch.int8)
    tensors["example_id"] = torch.arange(examples)
    return TensorSplit(tensors)


def measure(examples: int = 128, batch_size: int = 8, rounds: int = 60) -> dict[str, float]:
    """Median seconds per batch of both paths and the median per-round ratio host / device."""
    host_split = nyuv2_shaped_split(examples)
    meta = torch.device("meta")
    device_split = resident_split(host_split, meta)
    order = torch.randperm(examples)
    device_order = order.to(meta)
    position = {"index": 0}

    def next_slice(permutation: torch.Tensor) -> torch.Tensor:
        start = position["index"] % (examples // batch_size) * batch_size
        return permutation[start : start + batch_size]

    def host_path() -> None:
        for value in host_split.batch(next_slice(order)).values():
            value.clone()  # standing in for the copy into pinned memory
        position["index"] += 1

    def on_device() -> None:
        device_split.batch(next_slice(device_order))

    steps = {"host": host_path, "device": on_device}
    times = interleaved_times(steps, rounds, warmup=3, cuda=False)
    ratio, lower, upper = ratio_with_interval(times, "host", "device")
    return {
        "host_s": statistics.median(times["host"]),
        "device_s": statistics.median(times["device"]),
        "ratio": ratio,
        "ratio_low": lower,
        "ratio_high": upper,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = measure(rounds=args.rounds)
    print(
        f"batch of 8 at 288x384: host path {1e3 * result['host_s']:.2f} ms (gather + copy), "
        f"data_on_device {1e3 * result['device_s']:.3f} ms of host time (gathers dispatched); "
        f"ratio {result['ratio']:.0f}x [{result['ratio_low']:.0f}, {result['ratio_high']:.0f}]"
    )


if __name__ == "__main__":
    main()
