"""ERM: the equal-weight sum of task losses (the paper's Eq. 1)."""

from __future__ import annotations

import torch
from torch import Tensor

from relif_ray.methods.base import MTLMethod, StepContext
from relif_ray.methods.registry import register


@register
class ERM(MTLMethod):
    """L_MTL = sum_k L_k; the ReLiF term, if any, is simply added."""

    name = "erm"
    citation = "equal-weight sum of the task losses (paper Eq. 1)"
    capturable = True

    def backward(
        self, task_losses: dict[str, Tensor], ctx: StepContext, extra_loss: Tensor | None = None
    ) -> dict[str, Tensor]:
        loss = torch.stack(list(task_losses.values())).sum()
        if extra_loss is not None:
            loss = loss + extra_loss
        loss.backward()
        return {k: torch.ones(()) for k in task_losses}
