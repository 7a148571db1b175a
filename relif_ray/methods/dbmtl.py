"""DB-MTL, Dual-Balancing Multi-Task Learning (Lin et al., "Dual-Balancing for Multi-Task
Learning", arXiv:2308.12029, 2023).

Loss-scale balancing: every task loss is replaced by its logarithm log(L_k + eps), eps = 1e-8.
Gradient-magnitude balancing: with g_k(t) the gradient of log(L_k + eps) on the shared
parameters at step t (t = 1, 2, ...), the method keeps an exponential moving average

    ghat_k(t) = beta_t ghat_k(t-1) + (1 - beta_t) g_k(t),   beta_t = beta / t^beta_sigma,
    ghat_k(0) = 0,

and the shared update is sum_k alpha_k ghat_k(t) with alpha_k = max_j ||ghat_j|| /
(||ghat_k|| + 1e-8): every task's averaged gradient is scaled up to the norm of the largest.
The task-specific parameters get the plain sum of the gradients of log(L_k + eps) (each head
its own task's). The returned task weights are the alpha_k. The ReLiF term's gradient is added
after the balancing, unchanged.

Checked against LibMTL's DB_MTL (median-research-group/LibMTL, LibMTL/weighting/DB_MTL.py,
commit 7b0f56a): the same EMA with a zero start and the step counted from 1, the same
alpha, the heads' gradients of the log losses from its per-task backward passes; defaults
beta = 0.9, beta_sigma = 0 (LibMTL's `--DB_beta`, `--DB_beta_sigma`). LibMTL refuses
`rep_grad` for DB-MTL, so there is no representation mode.

Cost: K backward passes (one per log loss, each head traversed once; see
`relif_ray.methods.gradients.backward_per_task`), +1 for the ReLiF term, and a K x P buffer
(P: the shared parameters) that is the module's extra state, so it is checkpointed with the
step count and a resumed run continues identically (a checkpoint grows by K x P floats).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from relif_ray.config import GradientSource
from relif_ray.methods.base import GRADIENT_AGGREGATION, MTLMethod, StepContext
from relif_ray.methods.gradients import backward_per_task, finish_backward
from relif_ray.methods.registry import option_in_range, register

EPS = 1e-8
"""Added to every loss before the log, and to every norm in alpha's denominator (LibMTL)."""


def magnitude_balance(averages: Tensor) -> Tensor:
    """alpha_k = max_j ||ghat_j|| / (||ghat_k|| + eps) for the K x P averaged gradients."""
    norms = averages.norm(dim=1)
    return norms.max() / (norms + EPS)


@register
class DBMTL(MTLMethod):
    """Log losses, then every task's averaged gradient scaled to the largest norm."""

    name = "dbmtl"
    kind = GRADIENT_AGGREGATION
    citation = "Lin et al., arXiv:2308.12029, 2023"
    eager_reason = "keeps its step count in Python and replaces its gradient averages each step"

    def __init__(
        self,
        task_names: list[str],
        seed: int = 0,
        beta: float = 0.9,
        beta_sigma: float = 0.0,
        gradient_source: GradientSource = "parameters",
    ) -> None:
        super().__init__(task_names, seed=seed, gradient_source=gradient_source)
        self.beta = option_in_range("beta", beta, "[0, 1)")
        self.beta_sigma = option_in_range("beta_sigma", beta_sigma, ">= 0")
        self.steps = 0
        self.averages: Tensor | None = None
        """ghat, K x P; allocated at the first step, when P is known."""

    def backward(
        self, task_losses: dict[str, Tensor], ctx: StepContext, extra_loss: Tensor | None = None
    ) -> dict[str, Tensor]:
        log_losses = [(task_losses[name] + EPS).log() for name in self.task_names]
        gradients = backward_per_task(log_losses, ctx.shared_parameters, extra_loss is not None)
        self.steps += 1
        rate = self.beta / self.steps**self.beta_sigma
        previous = torch.zeros_like(gradients) if self.averages is None else self.averages
        self.averages = gradients + rate * (previous.to(gradients) - gradients)
        weights = magnitude_balance(self.averages)
        finish_backward(ctx.shared_parameters, weights @ self.averages, extra_loss)
        return dict(zip(self.task_names, weights, strict=True))

    def get_extra_state(self) -> dict[str, Any]:
        return {"steps": self.steps, "averages": self.averages}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        self.averages = state["averages"]
