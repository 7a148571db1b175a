"""In-memory splits: what a format reader hands to a problem, and how batches are gathered.

The lowest layer of the library: readers (this package), tasks and models all speak `Batch`,
and nothing here knows a model or a task.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass

import torch
from torch import Tensor

Batch = dict[str, Tensor]
"""A mini-batch: "input" (and e.g. "lengths"), one target entry per task name, "example_id"."""


class Split(ABC):
    """One split held in memory; batches are gathered by example index."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def batch(self, index: Tensor) -> Batch:
        """The examples at `index` (a 1-D long tensor), including "example_id"."""

    def example_names(self) -> list[str] | None:
        """Each example's name in the source data, indexed by example id (a clinical stay's
        file or id), or None where examples have none: trials store them beside their
        outcomes so that an audit can join the examples to other files without the data."""
        return None


@dataclass(eq=False)  # compared and hashed by identity: a per-process cache keys on splits
class TensorSplit(Split):
    """A split whose every entry is a tensor with the examples along dim 0. Batches are
    gathered on the device the tensors and the index are on (`to` moves them)."""

    tensors: dict[str, Tensor]

    def __len__(self) -> int:
        return int(self.tensors["example_id"].shape[0])

    def batch(self, index: Tensor) -> Batch:
        return {key: value[index] for key, value in self.tensors.items()}

    def to(self, device: torch.device, keep_on_host: Collection[str] = ()) -> TensorSplit:
        """This split with its tensors on `device` (those named in `keep_on_host` stay)."""
        return TensorSplit(
            {
                key: value if key in keep_on_host else value.to(device)
                for key, value in self.tensors.items()
            }
        )
