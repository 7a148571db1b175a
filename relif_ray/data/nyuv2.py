"""Reader for NYUv2 in the on-disk layout shared by MTAN and LibMTL.

Layout: `root/{train,val[,test]}/{image,label,depth,normal}/{i}.npy` with i = 0..N-1, where
example i of a split is the four files with the same index:

- image  H x W x 3, float (any float dtype; returned as float32),
- label  H x W, the 13 NYUv2 classes 0..12 and -1 = ignore, stored as float or integer dtype
  (values must be integral),
- depth  H x W x 1, metres, 0 = invalid,
- normal H x W x 3, unit vectors, (0, 0, 0) = invalid.

The same reader serves the real data and the synthetic scenes of `synthetic_nyuv2`.
`check_nyuv2` applies the same rules before any trial starts (a sweep's driver runs it), to
the headers of every file and the values of every label, depth and normal map. Every file is
validated as it is loaded (vectorised numpy per file); anything malformed raises a one-line
`UserError` that names the offending file or directory. Files are loaded with
`allow_pickle=False`, so a pickled (object) array is rejected, never unpickled.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from relif_ray.errors import UserError

MODALITIES = ("image", "label", "depth", "normal")
REQUIRED_SPLITS = ("train", "val")
OPTIONAL_SPLITS = ("test",)
NUM_CLASSES = 13
IGNORE_LABEL = -1
NORMAL_LENGTH_TOLERANCE = 1e-2
SCANNED_MODALITIES = ("label", "depth", "normal")
"""The modalities whose values `check_nyuv2` reads before a sweep (all but the images)."""

# Trailing (channel) shape each modality must have after H x W; () means exactly H x W.
_CHANNELS: dict[str, tuple[int, ...]] = {"image": (3,), "label": (), "depth": (1,), "normal": (3,)}


def read_nyuv2(root: str | Path) -> dict[str, dict[str, Tensor]]:
    """Read the "train" and "val" splits (and "test" when its folder exists) of `root`."""
    root = _existing_root(root)
    return {split: read_nyuv2_split(root, split) for split in _split_names(root)}


def read_nyuv2_split(root: str | Path, split: str) -> dict[str, Tensor]:
    """Read one split into tensors with the examples along dim 0.

    Returns image (N,3,H,W) float32, label (N,H,W) int64 with -1 = ignore, depth (N,1,H,W)
    float32 (0 = invalid), normal (N,3,H,W) float32 (0 = invalid) and example_id (N,) int64,
    the file index i.
    """
    split_dir, count = _split_dir_and_count(root, split)
    first = split_dir / "image" / "0.npy"
    height, width = _load_checked(first, "image").shape[:2]
    arrays = {
        "image": np.empty((count, 3, height, width), np.float32),
        "label": np.empty((count, height, width), np.int64),
        "depth": np.empty((count, 1, height, width), np.float32),
        "normal": np.empty((count, 3, height, width), np.float32),
    }
    for index in range(count):
        for modality in MODALITIES:
            path = split_dir / modality / f"{index}.npy"
            array = _load_checked(path, modality)
            _check_size(path, array.shape, (height, width), first)
            arrays[modality][index] = array if modality == "label" else array.transpose(2, 0, 1)
    tensors = {name: torch.from_numpy(value) for name, value in arrays.items()}
    tensors["example_id"] = torch.arange(count, dtype=torch.int64)
    return tensors


def check_nyuv2(root: str | Path) -> None:
    """Check every file of `root` as `read_nyuv2` would, before any trial (a sweep's driver
    runs it): the splits, the numbering, each file's shape, dtype and size from its .npy
    header, and the values of every label, depth and normal map (`SCANNED_MODALITIES`: class
    range, finiteness, unit normals). Images are memory-mapped, never read (they are most of
    the bytes), so a truncated image is found but its pixel values are left to the reader.
    Its measured cost on the real data's size is in docs/sweeps.md (seconds)."""
    root = _existing_root(root)
    for split in _split_names(root):
        split_dir, count = _split_dir_and_count(root, split)
        first = split_dir / "image" / "0.npy"
        size = _open_npy(first, "image", mmap=True).shape[:2]
        for index in range(count):
            for modality in MODALITIES:
                path = split_dir / modality / f"{index}.npy"
                scanned = modality in SCANNED_MODALITIES
                array = _open_npy(path, modality, mmap=not scanned)
                _check_size(path, array.shape, size, first)
                if scanned:
                    _check_values(path, modality, array)


def train_count(root: str | Path) -> int:
    """The number of training examples at `root` (from the file names, nothing loaded)."""
    return _split_dir_and_count(root, "train")[1]


def _split_names(root: Path) -> list[str]:
    return list(REQUIRED_SPLITS) + [s for s in OPTIONAL_SPLITS if (root / s).is_dir()]


def _split_dir_and_count(root: str | Path, split: str) -> tuple[Path, int]:
    split_dir = _existing_root(root) / split
    if not split_dir.is_dir():
        raise UserError(f"{split_dir}: NYUv2 split directory not found")
    return split_dir, _example_count(split_dir)


def _check_size(path: Path, shape: tuple[int, ...], size: tuple[int, int], first: Path) -> None:
    if tuple(shape[:2]) != tuple(size):
        raise UserError(
            f"{path}: size {shape[0]}x{shape[1]} differs from {first} ({size[0]}x{size[1]})"
        )


def _existing_root(root: str | Path) -> Path:
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: NYUv2 data directory not found")
    return root


def _example_count(split_dir: Path) -> int:
    """N, after checking every modality holds exactly the files 0.npy .. (N-1).npy."""
    counts: dict[str, int] = {}
    for modality in MODALITIES:
        folder = split_dir / modality
        if not folder.is_dir():
            raise UserError(f"{folder}: NYUv2 modality directory not found")
        counts[modality] = _contiguous_count(folder)
    expected = counts["image"]
    for modality, count in counts.items():
        if count < expected:
            raise UserError(
                f"{split_dir / modality / f'{count}.npy'}: missing, but "
                f"{split_dir / 'image' / f'{count}.npy'} exists"
            )
        if count > expected:
            raise UserError(
                f"{split_dir / modality / f'{expected}.npy'}: has no matching "
                f"{split_dir / 'image' / f'{expected}.npy'}"
            )
    return expected


def _contiguous_count(folder: Path) -> int:
    indices = set()
    for path in folder.glob("*.npy"):
        if not path.stem.isdigit() or str(int(path.stem)) != path.stem:
            raise UserError(f"{path}: file name must be <index>.npy with index 0, 1, 2, ...")
        indices.add(int(path.stem))
    if not indices:
        raise UserError(f"{folder}: no .npy files")
    count = len(indices)
    if max(indices) != count - 1:
        first_missing = min(set(range(count)) - indices)
        raise UserError(
            f"{folder / f'{first_missing}.npy'}: missing; files must be numbered 0..{count - 1} "
            f"without gaps (largest index found: {max(indices)})"
        )
    return count


def _load_checked(path: Path, modality: str) -> np.ndarray:
    """Load one .npy file (never unpickling) and validate it for its modality."""
    array = _open_npy(path, modality, mmap=False)
    _check_values(path, modality, array)
    return array


def _open_npy(path: Path, modality: str, mmap: bool) -> np.ndarray:
    """One .npy array (never unpickled) with the shape and dtype of its modality; `mmap`
    maps it instead of reading it, so only the header is read."""
    try:
        array = np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        reason = " ".join(str(error).split())
        raise UserError(f"{path}: unreadable .npy file ({reason})") from None
    if not isinstance(array, np.ndarray):
        array.close()
        raise UserError(f"{path}: not a single .npy array (an .npz archive?)")
    _check_shape(path, modality, array.shape)
    _check_dtype(path, modality, array.dtype)
    return array


def _check_shape(path: Path, modality: str, shape: tuple[int, ...]) -> None:
    channels = _CHANNELS[modality]
    expected = "HxW" + "".join(f"x{c}" for c in channels)
    if len(shape) != 2 + len(channels) or tuple(shape[2:]) != channels:
        text = "x".join(str(n) for n in shape) or "scalar"
        raise UserError(f"{path}: {modality} must have shape {expected}, got {text}")
    if shape[0] == 0 or shape[1] == 0:
        raise UserError(f"{path}: {modality} is empty (shape {tuple(shape)})")


def _check_dtype(path: Path, modality: str, dtype: np.dtype) -> None:
    if modality == "label" and dtype.kind not in "fiu":
        raise UserError(f"{path}: label must be a float or integer array, got dtype {dtype}")
    if modality != "label" and dtype.kind != "f":
        raise UserError(f"{path}: {modality} must be a float array, got dtype {dtype}")


def _check_values(path: Path, modality: str, array: np.ndarray) -> None:
    if modality == "label":
        _check_label(path, array)
        return
    if not np.isfinite(array).all():
        raise UserError(f"{path}: {modality} contains NaN or infinite values")
    if modality == "depth" and array.min() < 0:
        raise UserError(f"{path}: depth contains negative values (min {array.min():g})")
    if modality == "normal":
        _check_unit_normals(path, array)


def _check_label(path: Path, array: np.ndarray) -> None:
    if array.dtype.kind == "f":
        if not np.isfinite(array).all():
            raise UserError(f"{path}: label contains NaN or infinite values")
        if not (array == np.round(array)).all():
            raise UserError(f"{path}: label contains non-integral values")
    low, high = array.min(), array.max()
    if low < IGNORE_LABEL or high > NUM_CLASSES - 1:
        raise UserError(
            f"{path}: label values must be in -1..{NUM_CLASSES - 1} (-1 = ignore), "
            f"found range {low:g}..{high:g}"
        )


def _check_unit_normals(path: Path, array: np.ndarray) -> None:
    squared_length = np.einsum("hwc,hwc->hw", array, array)
    too_short = squared_length < (1.0 - NORMAL_LENGTH_TOLERANCE) ** 2
    too_long = squared_length > (1.0 + NORMAL_LENGTH_TOLERANCE) ** 2
    off_unit = (squared_length > 0) & (too_short | too_long)
    if off_unit.any():
        row, col = np.argwhere(off_unit)[0]
        raise UserError(
            f"{path}: normal at pixel ({row}, {col}) has length "
            f"{np.sqrt(squared_length[row, col]):.4g}; non-zero normals must be unit vectors "
            f"(tolerance {NORMAL_LENGTH_TOLERANCE})"
        )
