"""The cost of the NYUv2 preflight (`relif_ray.data.nyuv2.check_nyuv2`) on the real data's size.

A sweep's driver runs the check before Ray starts: every file's header, and the values of
every label, depth and normal map. This writes a data set of NYUv2's size (795 train / 654
val at 288x384, float32; the images are sparse files of the right size, since only their
headers are read) into a temporary folder and times the check: once with the files evicted
from the page cache (`posix_fadvise`, this process's files only) and twice warm.

    python benchmarks/nyuv2_check.py [--train 795 --val 654 --height 288 --width 384]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from numpy.lib.format import open_memmap

from relif_ray.data.nyuv2 import check_nyuv2


def write_dataset(root: Path, sizes: dict[str, int], height: int, width: int) -> None:
    """Valid NYUv2 files: random labels in -1..12, positive depth, unit normals."""
    rng = np.random.default_rng(0)
    normals = rng.normal(size=(height, width, 3)).astype(np.float32)
    normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
    for split, count in sizes.items():
        for modality in ("image", "label", "depth", "normal"):
            (root / split / modality).mkdir(parents=True)
        for index in range(count):
            name = f"{index}.npy"
            image = open_memmap(root / split / "image" / name, "w+", np.float32, (height, width, 3))
            image.flush()  # a sparse file with a valid header: only the header is ever read
            label = rng.integers(-1, 13, size=(height, width)).astype(np.float32)
            np.save(root / split / "label" / name, label)
            depth = rng.uniform(0.5, 10.0, size=(height, width, 1)).astype(np.float32)
            np.save(root / split / "depth" / name, depth)
            np.save(root / split / "normal" / name, np.roll(normals, index, axis=0))


def evict(root: Path) -> None:
    for path in root.rglob("*.npy"):
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def timed_check(root: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one check."""
    wall, cpu = time.perf_counter(), time.process_time()
    check_nyuv2(root)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=795)
    parser.add_argument("--val", type=int, default=654)
    parser.add_argument("--height", type=int, default=288)
    parser.add_argument("--width", type=int, default=384)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "nyuv2"
        write_dataset(root, {"train": args.train, "val": args.val}, args.height, args.width)
        scanned = sum(p.stat().st_size for p in root.rglob("*.npy") if p.parent.name != "image")
        print(f"{args.train} + {args.val} examples at {args.height}x{args.width}, float32; "
              f"label, depth and normal files: {scanned / 1e9:.2f} GB; load average "
              f"{os.getloadavg()[0]:.1f}")  # fmt: skip
        evict(root)
        for state in ("evicted from the page cache", "warm", "warm"):
            wall, cpu = timed_check(root)
            print(f"check_nyuv2, {state}: {wall:.2f} s wall, {cpu:.2f} s CPU")


if __name__ == "__main__":
    main()
