"""Host work at NYUv2's real size on the CPU, in no default run: `host-batch` (one training batch
on the host path against `train.data_on_device`, whose gathers run on the "meta" device so that
only the host's share is timed) and `preflight` (the NYUv2 check a sweep's driver runs before
Ray starts, at the real size, with the files evicted from the page cache and warm)."""

from __future__ import annotations

import os
import statistics
import time

import torch

from benchmarks.harness import Context, interleaved_times, ratio_with_interval
from relif_ray.data.splits import TensorSplit

SHAPES = {"image": (3, 288, 384), "depth": (1, 288, 384), "normal": (3, 288, 384)}
"""NYUv2's float32 entries per example (labels are int8: `seg`)."""


def nyuv2_shaped_split(examples: int) -> TensorSplit:
    tensors = {key: torch.rand(examples, *shape) for key, shape in SHAPES.items()}
    tensors["seg"] = torch.randint(-1, 13, (examples, 288, 384), dtype=torch.int8)
    tensors["example_id"] = torch.arange(examples)
    return TensorSplit(tensors)


def measure_batch(examples: int = 128, batch_size: int = 8, rounds: int = 60) -> dict[str, float]:
    """Median seconds per batch of both paths and the median per-round ratio host / device."""
    from relif_ray.transfer import resident_split

    host_split = nyuv2_shaped_split(examples)
    meta = torch.device("meta")
    device_split = resident_split(host_split, meta)
    order = torch.randperm(examples)
    device_order, position = order.to(meta), {"index": 0}

    def next_slice(permutation: torch.Tensor) -> torch.Tensor:
        start = position["index"] % (examples // batch_size) * batch_size
        return permutation[start : start + batch_size]

    def host_path() -> None:
        for value in host_split.batch(next_slice(order)).values():
            value.clone()  # standing in for the copy into pinned memory
        position["index"] += 1

    times = interleaved_times({"host": host_path,
                               "device": lambda: device_split.batch(next_slice(device_order))},
                              rounds, warmup=3, cuda=False)  # fmt: skip
    ratio, lower, upper = ratio_with_interval(times, "host", "device")
    host, device = (statistics.median(times[name]) for name in ("host", "device"))
    return {"host_s": host, "device_s": device, "ratio": ratio, "ratio_low": lower,
            "ratio_high": upper}  # fmt: skip


def host_batch_suite(ctx: Context) -> None:
    examples, rounds = (16, 2) if ctx.toy else (128, 60)  # about 1.3 GB for 128 examples
    m = measure_batch(examples, rounds=rounds)
    ctx.row("batch of 8 at 288x384, host path / data_on_device host time", m["ratio"], "x",
            f"[{m['ratio_low']:.0f}, {m['ratio_high']:.0f}]; host path {1e3 * m['host_s']:.2f} "
            f"ms (gather + copy), data_on_device {1e3 * m['device_s']:.3f} ms of host time "
            f"(gathers dispatched); {rounds} rounds")  # fmt: skip


def preflight_suite(ctx: Context) -> None:
    """On the real-size data the sweep suites share (written by `relif make-data`)."""
    from benchmarks.sweep import REAL_DATA, TOY_DATA, real_data
    from relif_ray.data.nyuv2 import check_nyuv2

    root, sizes = real_data(ctx), TOY_DATA if ctx.toy else REAL_DATA
    scanned = sum(p.stat().st_size for p in root.rglob("*.npy") if p.parent.name != "image")
    for path in root.rglob("*.npy"):  # evicted from the page cache
        descriptor = os.open(path, os.O_RDONLY)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(descriptor)
    for state in ("evicted from the page cache", "warm", "warm again"):
        wall, cpu = time.perf_counter(), time.process_time()
        check_nyuv2(root)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        ctx.row(f"NYUv2 preflight check, {state}", wall, "s",
                f"{cpu:.2f} s of CPU; {sizes['train']} + {sizes['val']} examples at "
                f"{sizes['height']}x{sizes['width']}; label, depth and normal files "
                f"{scanned / 1e9:.2f} GB")  # fmt: skip
