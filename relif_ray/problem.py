"""A multi-task problem: tasks, in-memory data splits and the model that fits them.

Each data set registers a loader under its `data.dataset` name. Loaded problems are cached
per process (keyed by data set and root), so a Ray worker that runs many trials reads its
data once, not once per trial.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from relif_ray.config import DataConfig, ModelConfig
from relif_ray.errors import UserError
from relif_ray.tasks.base import Batch, ModelOutput, Task


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


class Split(ABC):
    """One split held in memory; batches are gathered by example index."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def batch(self, index: Tensor) -> Batch:
        """The examples at `index` (a 1-D long tensor), including "example_id"."""


@dataclass
class TensorSplit(Split):
    """A split whose every entry is a tensor with the examples along dim 0."""

    tensors: dict[str, Tensor]

    def __len__(self) -> int:
        return int(self.tensors["example_id"].shape[0])

    def batch(self, index: Tensor) -> Batch:
        return {key: value[index] for key, value in self.tensors.items()}


@dataclass
class Problem:
    """Tasks + splits + a model factory for one data set."""

    name: str
    tasks: list[Task]
    splits: dict[str, Split]
    model_factory: Callable[[ModelConfig], MultiTaskModel]

    @property
    def task_names(self) -> list[str]:
        return [task.name for task in self.tasks]

    def build_model(self, config: ModelConfig) -> MultiTaskModel:
        return self.model_factory(config)


PROBLEM_LOADERS: dict[str, Callable[[str], Problem]] = {}


def register_problem(name: str) -> Callable[[Callable[[str], Problem]], Callable[[str], Problem]]:
    """Decorator: `loader(root) -> Problem` becomes available as `data.dataset = name`."""

    def decorator(loader: Callable[[str], Problem]) -> Callable[[str], Problem]:
        PROBLEM_LOADERS[name] = loader
        return loader

    return decorator


def load_problem(config: DataConfig) -> Problem:
    """Load (once per process) the problem named by `config.dataset` from `config.root`."""
    import relif_ray.datasets  # noqa: F401  (registers every data set's loader)

    if config.dataset not in PROBLEM_LOADERS:
        raise UserError(f"config field data.dataset: no loader for '{config.dataset}'")
    if not config.root:
        raise UserError("config field data.root: no data directory given")
    return _cached_problem(config.dataset, config.root)


@functools.lru_cache(maxsize=4)
def _cached_problem(dataset: str, root: str) -> Problem:
    return PROBLEM_LOADERS[dataset](root)


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
