"""The interface every multi-task model implements: a shared backbone and one head per task."""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import nn

from relif_ray.data.splits import Batch
from relif_ray.tasks.base import ModelOutput


class MultiTaskModel(nn.Module, ABC):
    """Shared backbone + one head per task."""

    @abstractmethod
    def forward(self, batch: Batch) -> ModelOutput: ...

    @abstractmethod
    def shared_parameters(self) -> list[nn.Parameter]:
        """Parameters of the shared backbone (where per-task gradients are compared)."""

    @abstractmethod
    def last_shared_parameters(self) -> list[nn.Parameter]:
        """Parameters of the last shared layer (GradNorm's W)."""
