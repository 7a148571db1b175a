"""Host-to-device transfer of batches, asynchronous where the device is a GPU."""

from __future__ import annotations

import torch
from torch import Tensor

from relif_ray.data.splits import Batch

HOST_KEYS = frozenset({"lengths"})
"""Batch entries that stay on the host: `pack_padded_sequence` reads sequence lengths there,
and fetching them back from the GPU would make the host wait for the device every step."""


def move_batch(batch: Batch, device: torch.device) -> Batch:
    """Copy a batch (except `HOST_KEYS`) to `device`; to CUDA it goes through pinned
    (page-locked) host memory, so the copy is asynchronous and the host goes on queueing work.
    The pinned staging buffers come from PyTorch's caching host allocator, which keeps each
    one until its copy is done."""
    moved = {}
    for key, value in batch.items():
        if key in HOST_KEYS:
            moved[key] = value.cpu()
        elif device.type == "cuda":
            moved[key] = _pinned(value).to(device, non_blocking=True)
        else:
            moved[key] = value.to(device)
    return moved


def _pinned(value: Tensor) -> Tensor:
    return value if value.is_cuda or value.is_pinned() else value.pin_memory()
