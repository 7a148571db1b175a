"""The MTL method interface: how task losses become parameter gradients.

A method is an `nn.Module` (so its own parameters, buffers and extra state travel with the
engine's checkpoint) with one job: given the per-task losses of a step, fill `.grad` of every
trainable parameter. The engine zeroes gradients before and steps the optimizer after.

The ReLiF term (lambda_t * L_lip) arrives as `extra_loss`. Every method adds its gradient
AFTER its own aggregation of the task gradients (the paper's suggestion for hybrids), so a
gradient-manipulating method never reweights or projects the fairness term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor, nn


@dataclass
class StepContext:
    """What a method may look at during one optimisation step.

    shared_parameters: parameters of the shared backbone (per-task gradients are taken here).
    last_shared_parameters: parameters of the last shared layer (GradNorm's W).
    step: 0-based global optimisation step.
    """

    shared_parameters: list[nn.Parameter]
    last_shared_parameters: list[nn.Parameter]
    step: int


class MTLMethod(nn.Module):
    """Base class: subclasses set `name` and implement `backward`."""

    name: ClassVar[str]

    def __init__(self, task_names: list[str], seed: int = 0) -> None:
        super().__init__()
        self.task_names = list(task_names)
        self.seed = seed

    def backward(
        self, task_losses: dict[str, Tensor], ctx: StepContext, extra_loss: Tensor | None = None
    ) -> dict[str, Tensor]:
        """Fill `.grad` of all parameters; return the (detached) task weights used."""
        raise NotImplementedError

    def promises_non_conflict(self) -> bool:
        """True when the shared update d never conflicts with a task: g_k . d >= 0 for every k.

        A method whose paper proves this (for its configured number of tasks and options)
        overrides it; the property is then tested for that method.
        """
        return False
