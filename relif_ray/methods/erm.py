"""ERM: the equal-weight sum of task losses (the paper's Eq. 1)."""

from __future__ import annotations

import torch
from torch import Tensor

from relif_ray.methods.base import LossWeighting
from relif_ray.methods.registry import register


@register
class ERM(LossWeighting):
    """L_MTL = sum_k L_k; the ReLiF term, if any, is simply added."""

    name = "erm"
    citation = "equal-weight sum of the task losses (paper Eq. 1)"
    capturable = True

    def weighted_loss(self, losses: Tensor) -> tuple[Tensor, Tensor]:
        return losses.sum(), torch.ones(len(self.task_names))
