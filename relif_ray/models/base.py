"""The interface every multi-task model implements, and the one every architecture's trunk does.

A model (`MultiTaskModel`) maps a batch to every task's prediction (`ModelOutput`). Besides the
forward it says two things that the rest of the system depends on:

- which parameters are SHARED (`shared_parameters`): every parameter that more than one task's
  loss depends on, the parameters where per-task gradients can conflict. The gradient methods
  (PCGrad, FairGrad, GradNorm, the TorchJD aggregators) take one gradient per task there and
  combine them; every other parameter gets the plain sum of the task losses' gradients.
- what the REPRESENTATION is (`ModelOutput.representation`, (B, D)): the audit's method-induced
  thresholds and ReLiF's prototype distances are measured in it. It is what the task heads
  read, pooled (global average pool of a feature map, the state at a stay's last step); where
  the tasks read different tensors (every architecture but hard sharing), the tasks' pooled
  tensors concatenated in task order, so that one map x -> f(x) serves every pair of tasks.

`relif_ray.models.architectures` lists, per architecture, what these are; docs/architectures.md
says it in words. An architecture other than hard parameter sharing is a `TaskTrunk` (the
architecture's encoder: input -> the tensor each task's head reads) inside the dense or the
clinical model, which add the heads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor, nn

from relif_ray.config import HARD_SHARING
from relif_ray.data.splits import Batch
from relif_ray.errors import UserError
from relif_ray.tasks.base import ModelOutput


class MultiTaskModel(nn.Module, ABC):
    """A multi-task model: forward, its shared parameters and its last shared layer.

    `architecture` names the architecture (`model.architecture`). `one_encoder_output` says
    whether every head reads ONE encoder output (`ModelOutput.encoder_output`), the tensor the
    representation-gradient mode (`method.gradient_source: representation`) differentiates
    at; an architecture with one such tensor per task has none."""

    architecture: str = HARD_SHARING
    one_encoder_output: bool = True

    @abstractmethod
    def forward(self, batch: Batch) -> ModelOutput: ...

    @abstractmethod
    def shared_parameters(self) -> list[nn.Parameter]:
        """Every parameter that more than one task's loss depends on (module docstring)."""

    @abstractmethod
    def last_shared_parameters(self) -> list[nn.Parameter]:
        """Parameters of the last shared layer (GradNorm's W): the last layer of each shared
        module whose output a task-specific part reads."""


@dataclass
class TaskInputs:
    """What an architecture's trunk gives the heads: task -> the tensor its head reads, and a
    loss term of the architecture itself (DSelect-k's gate regularizer), added to the step's
    loss after the method's aggregation, as the ReLiF term is; None where there is none."""

    per_task: dict[str, Tensor]
    auxiliary_loss: Tensor | None = None


class TaskTrunk(nn.Module, ABC):
    """One architecture's encoder: `forward` gives every task's head input (`TaskInputs`).

    Its input is the image batch (B, 3, H, W) for a ResNet trunk, or, for an LSTM trunk, the
    padded stays (B, T, F) and their packing (`relif_ray.models.clinical.Stays`)."""

    name: ClassVar[str]

    @abstractmethod
    def shared_parameters(self) -> list[nn.Parameter]:
        """Every parameter of the trunk that more than one task's head input depends on."""

    @abstractmethod
    def last_shared_parameters(self) -> list[nn.Parameter]:
        """The last layer of each shared module whose output a task-specific part reads."""


def check_gradient_source(model: nn.Module, gradient_source: str) -> None:
    """`method.gradient_source: representation` differentiates at the one encoder output every
    head reads; a one-line error for a model without one (`one_encoder_output`)."""
    if gradient_source == "representation" and not getattr(model, "one_encoder_output", True):
        architecture = getattr(model, "architecture", type(model).__name__)
        raise UserError(
            "config field method.gradient_source: 'representation' needs one encoder output "
            f"that every head reads; model.architecture {architecture} gives each task its own "
            f"(use parameters, or architecture {HARD_SHARING})"
        )
