"""Host-to-device transfer of batches, asynchronous where the device is a GPU, and the splits
held on the device (`train.data_on_device`)."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from relif_ray.data.splits import Batch, TensorSplit

HOST_KEYS = frozenset({"lengths"})
"""Batch entries that stay on the host: `pack_padded_sequence` reads sequence lengths there,
and fetching them back from the GPU would make the host wait for the device every step."""


def move_batch(batch: Batch, device: torch.device) -> Batch:
    """Copy a batch (except `HOST_KEYS`) to `device`; to CUDA it goes through pinned
    (page-locked) host memory, so the copy is asynchronous and the host goes on queueing work.
    The pinned staging buffers come from PyTorch's caching host allocator, which keeps each
    one until its copy is done."""
    return {
        key: value.cpu() if key in HOST_KEYS else move_tensor(value, device)
        for key, value in batch.items()
    }


def move_tensor(value: Tensor, device: torch.device) -> Tensor:
    """`value` on `device`; to CUDA through pinned memory, without blocking the host."""
    if device.type != "cuda":
        return value.to(device)
    pinned = value if value.is_cuda or value.is_pinned() else value.pin_memory()
    return pinned.to(device, non_blocking=True)


@functools.lru_cache(maxsize=3)
def resident_split(split: TensorSplit, device: torch.device) -> TensorSplit:
    """`split` with its tensors (but `HOST_KEYS`) on `device`, copied once per process: the
    trials a Ray worker runs one after another on the same data share the copy (the problem,
    and so the split, is cached per process too). The last three (a data set's train, val and
    test splits) stay until others replace them; each takes device memory for the whole split
    (`TrainConfig.data_on_device`)."""
    return split.to(device, keep_on_host=HOST_KEYS)
