"""RLW, Random Loss Weighting (Lin et al., TMLR 2022, "Reasonable Effectiveness of Random
Weighting: A Litmus Test for Multi-Task Learning").

At every step the task weights are drawn afresh as lambda = softmax(z), z ~ N(0, I_K) (the
paper's default distribution), and the network gets one backward of sum_k lambda_k L_k; the
weights sum to 1. The ReLiF term is added unweighted.

Checked against LibMTL's RLW (median-research-group/LibMTL, LibMTL/weighting/RLW.py, commit
d05c80c: `softmax(torch.randn(task_num))`; the LibMTL 1.1.5 package, which the tests run as
the reference, draws the same standard normal through `torch.distributions.Normal`).

Randomness: LibMTL draws from the global torch generator; here z comes from the method's own
`torch.Generator` seeded with the run's seed (on the CPU, so the draws do not depend on the
device), whose state is the module's extra state: a resumed run draws the same weights as an
uninterrupted one, and the draws do not disturb the global generator (dropout).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from relif_ray.config import GradientSource
from relif_ray.methods.base import LossWeighting
from relif_ray.methods.registry import register


@register
class RLW(LossWeighting):
    """Random task weights softmax(z), z ~ N(0, I), drawn every step from a seeded generator."""

    name = "rlw"
    citation = "Lin et al., TMLR 2022"
    eager_reason = "draws its task weights on the host each step (a seeded CPU generator)"

    def __init__(
        self, task_names: list[str], seed: int = 0, gradient_source: GradientSource = "parameters"
    ) -> None:
        super().__init__(task_names, seed=seed, gradient_source=gradient_source)
        self.generator = torch.Generator().manual_seed(seed)

    def draw_weights(self) -> Tensor:
        """softmax(z) for a fresh z ~ N(0, I_K) from the method's generator (CPU)."""
        return torch.softmax(torch.randn(len(self.task_names), generator=self.generator), dim=0)

    def weighted_loss(self, losses: Tensor) -> tuple[Tensor, Tensor]:
        weights = self.draw_weights().to(losses)
        return (weights * losses).sum(), weights.detach()

    def get_extra_state(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
