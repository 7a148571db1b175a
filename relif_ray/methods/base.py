"""The MTL method interface: how task losses become parameter gradients.

A method is an `nn.Module` (so its own parameters, buffers and extra state travel with the
engine's checkpoint) with one job: given the per-task losses of a step, fill `.grad` of every
trainable parameter. The engine zeroes gradients before and steps the optimizer after.

The ReLiF term (lambda_t * L_lip) arrives as `extra_loss`. Every method adds its gradient
AFTER its own aggregation of the task gradients (the paper's suggestion for hybrids), so a
gradient-manipulating method never reweights or projects the fairness term.

Gradient source (`method.gradient_source`): "parameters" (every method; exact) takes the
per-task gradients on the shared parameters; "representation" (only the methods that list it
in `gradient_sources`: PCGrad and GradNorm) takes them on the encoder output every head
consumes and backpropagates once through the encoder, an approximation described in
`relif_ray.methods.gradients`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from torch import Tensor, nn

from relif_ray.config import GradientSource
from relif_ray.errors import UserError


@dataclass
class StepContext:
    """What a method may look at during one optimisation step.

    shared_parameters: parameters of the shared backbone (per-task gradients are taken here).
    last_shared_parameters: parameters of the last shared layer (GradNorm's W).
    step: 0-based global optimisation step.
    encoder_output: the encoder output z that every task head consumes (the dense model's
        feature map, the clinical LSTM outputs), still attached to the graph; None when the
        model does not expose it. Only the representation gradient source uses it.
    head_parameters: the model's trainable parameters outside the shared encoder (the heads).
    """

    shared_parameters: list[nn.Parameter]
    last_shared_parameters: list[nn.Parameter]
    step: int
    encoder_output: Tensor | None = None
    head_parameters: list[nn.Parameter] = field(default_factory=list)


class MTLMethod(nn.Module):
    """Base class: subclasses set `name` and implement `backward`; a method with a
    representation mode lists it in `gradient_sources`."""

    name: ClassVar[str]
    gradient_sources: ClassVar[tuple[GradientSource, ...]] = ("parameters",)

    def __init__(
        self, task_names: list[str], seed: int = 0, gradient_source: GradientSource = "parameters"
    ) -> None:
        super().__init__()
        if gradient_source not in self.gradient_sources:
            available = ", ".join(self.gradient_sources)
            raise UserError(
                f"method.gradient_source: {self.name} has no '{gradient_source}' mode "
                f"(available: {available})"
            )
        self.task_names = list(task_names)
        self.seed = seed
        self.gradient_source = gradient_source

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
