"""The MTL method interface: how task losses become parameter gradients.

A method is an `nn.Module` (so its own parameters, buffers and extra state travel with the
engine's checkpoint) with one job: given the per-task losses of a step, fill `.grad` of every
trainable parameter. The engine zeroes gradients before and steps the optimizer after.

The ReLiF term (lambda_t * L_lip) arrives as `extra_loss`. Every method adds its gradient
AFTER its own aggregation of the task gradients (the paper's suggestion for hybrids), so a
gradient-manipulating method never reweights or projects the fairness term.

Gradient source (`method.gradient_source`): "parameters" (every method; exact) takes the
per-task gradients on the shared parameters; "representation" (only the methods that list it
in `gradient_sources`: PCGrad, GradNorm, MGDA, IMTL-G, Aligned-MTL) takes them on the
encoder output every head consumes and backpropagates once through the encoder, an
approximation described in `relif_ray.methods.gradients`.

Hooks around the optimizer step (no-ops by default; the engine calls them for every method):
`after_step(batch_losses)` right after the optimizer step, with a function that returns the
task losses of the step's batch at the updated parameters (a forward without graph, run only
if the method calls it: FAMO's logit update); `end_epoch()` after an epoch's last step (DWA's
per-epoch loss averages).

Description (class attributes, listed by the registry): `kind` (LOSS_WEIGHTING: one backward
of a weighted sum of the task losses; GRADIENT_AGGREGATION: per-task gradients on the shared
parameters, at most K backward passes), `citation` (the paper that defines it), `requires`
(modules of the `mtl` install extra the method needs) and the options: the keyword arguments
of `__init__` after the base ones, with their defaults (`option_defaults`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from relif_ray.config import GradientSource
from relif_ray.errors import UserError

MethodKind = Literal["loss weighting", "gradient aggregation"]
LOSS_WEIGHTING: MethodKind = "loss weighting"
GRADIENT_AGGREGATION: MethodKind = "gradient aggregation"
BASE_ARGUMENTS = ("self", "task_names", "seed", "gradient_source")
"""The keyword arguments every method takes; the others are its options."""


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
    kind: ClassVar[MethodKind] = LOSS_WEIGHTING
    citation: ClassVar[str] = ""
    capturable: ClassVar[bool] = False
    """Whether a CUDA graph may capture the method's step (`relif_ray.cuda_graph`): it reads
    nothing from the host, changes its state only in place, has no `after_step` hook and
    returns its weights as device tensors or constants (checked on the CPU for every method
    that says so)."""
    eager_reason: ClassVar[str] = "has not been checked for capture in a CUDA graph"
    """Why the method's steps stay eager, completing "method NAME ..." in a trial's log."""
    requires: ClassVar[tuple[str, ...]] = ()
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

    def after_step(self, batch_losses: Callable[[], dict[str, Tensor]]) -> None:
        """Called right after the optimizer step; `batch_losses()` gives the task losses of
        the step's batch at the updated parameters (one forward without graph per call)."""

    def end_epoch(self) -> None:
        """Called after the last step of every full epoch."""

    @classmethod
    def option_defaults(cls) -> dict[str, Any]:
        """The method's options (the keyword arguments of `__init__` after the base ones) and
        their defaults."""
        parameters = inspect.signature(cls.__init__).parameters.values()
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        return {
            p.name: p.default
            for p in parameters
            if p.name not in BASE_ARGUMENTS and p.kind not in variadic
        }

    def splits_at_host_solve(self) -> bool:
        """True when the step splits at a solve on the host of the K x K Gramian (the
        gradient aggregators with parameter gradients, `relif_ray.methods.gradients`): its
        device parts before and after the solve may then each be one CUDA graph, though the
        whole step cannot (`relif_ray.cuda_graph.SolvedGraphedStep`)."""
        return False

    def promises_non_conflict(self) -> bool:
        """True when the shared update d never conflicts with a task: g_k . d >= 0 for every k.

        A method whose paper proves this (for its configured number of tasks and options)
        overrides it; the property is then tested for that method.
        """
        return False


class LossWeighting(MTLMethod):
    """A loss-weighting method: one backward of a weighted sum of the task losses, with the
    ReLiF term added after the weighting, never weighted. Subclasses implement
    `weighted_loss`; a method that needs more than the losses (GradNorm's gradient norms)
    implements `backward` itself."""

    kind = LOSS_WEIGHTING

    def weighted_loss(self, losses: Tensor) -> tuple[Tensor, Tensor]:
        """The scalar to backpropagate and the (K,) task weights it used (detached), from the
        (K,) task losses in `task_names` order."""
        raise NotImplementedError

    def backward(
        self, task_losses: dict[str, Tensor], ctx: StepContext, extra_loss: Tensor | None = None
    ) -> dict[str, Tensor]:
        losses = torch.stack([task_losses[name] for name in self.task_names])
        total, weights = self.weighted_loss(losses)
        if extra_loss is not None:
            total = total + extra_loss
        total.backward()
        return dict(zip(self.task_names, weights, strict=True))
