"""FAMO, Fast Adaptive Multitask Optimization (Liu et al., NeurIPS 2023, "FAMO: Fast Adaptive
Multitask Optimization").

Task logits xi (K), z = softmax(xi). The network gets one backward of

    L_FAMO = sum_k z_k log(L_k - L_k* + eps) / c,    c = sum_k z_k / (L_k - L_k* + eps),

with c held constant, i.e. the gradient sum_k w_k grad L_k with weights
w_k = z_k / (c (L_k - L_k* + eps)), which sum to 1 (returned as the task weights). After the
optimizer step the logits move towards the tasks whose log loss fell least: with
delta_k = log(L_k(theta_t) - L_k* + eps) - log(L_k(theta_{t+1}) - L_k* + eps) on the SAME
batch, the logit gradient is J_softmax(xi)^T delta = z * (delta - z . delta), and xi takes one
Adam step (learning rate `w_lr`, beta = (0.9, 0.999), eps = 1e-8) with L2 weight decay `gamma`
(the paper's regulariser), as `torch.optim.Adam(weight_decay=gamma)` does.

Checked against the authors' code (Cranial-XIX/FAMO, famo.py at commit 250873e, and
methods/weight_methods.py + experiments/nyuv2/trainer.py at commit 5b92c20) and LibMTL's
(median-research-group/LibMTL, LibMTL/weighting/FAMO.py, commit 8bc7605). Choices, all as in
the authors' code:

- the losses after the step are those of the step's batch, re-evaluated right after the
  optimizer step without graph, the model still in train mode (both codes do this in their
  training loops); here the engine offers that forward to `after_step`, so FAMO costs one
  extra forward pass per step (no extra backward);
- L_k* = 0 (neither code sets `min_losses`), eps = 1e-8;
- defaults w_lr = 0.025 and gamma = 0.01 (famo.py and experiments/utils.py; LibMTL uses
  gamma = 0.001);
- xi starts at 0 (equal weights).

Not done: the authors' famo.py clips the shared parameters' gradient to norm 1 after the
backward (its NYUv2 trainer calls that clip before the backward, where it has no effect); the
paper's Algorithm 1 has no clipping, and here `train.grad_clip` clips. The ReLiF term is added
to L_FAMO unweighted.

State: the logits, the Adam moments and step count, and the losses of the current step are
buffers, so they are checkpointed and a resumed run continues identically. The logits stay out
of the engine's optimizer (they are not parameters: their update is FAMO's own).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from relif_ray.config import GradientSource
from relif_ray.methods.base import LossWeighting
from relif_ray.methods.registry import option_in_range, register

EPS = 1e-8
"""Added to every loss before the log (both reference codes)."""
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


def famo_logit_gradient(logits: Tensor, delta: Tensor) -> Tensor:
    """J_softmax(xi)^T delta = z * (delta - z . delta): the vector-Jacobian product that
    autograd gives for softmax(xi) with grad_outputs delta."""
    z = torch.softmax(logits, dim=0)
    return z * (delta - (z * delta).sum())


@register
class FAMO(LossWeighting):
    """Loss weights from softmax logits that favour the slowest-improving log loss."""

    name = "famo"
    citation = "Liu et al., NeurIPS 2023"
    eager_reason = "re-evaluates the batch after the optimiser's step (its after_step hook)"

    def __init__(
        self,
        task_names: list[str],
        seed: int = 0,
        w_lr: float = 0.025,
        gamma: float = 0.01,
        gradient_source: GradientSource = "parameters",
    ) -> None:
        super().__init__(task_names, seed=seed, gradient_source=gradient_source)
        self.w_lr = option_in_range("w_lr", w_lr, ">= 0")
        self.gamma = option_in_range("gamma", gamma, ">= 0")
        num_tasks = len(task_names)
        self.register_buffer("logits", torch.zeros(num_tasks))
        self.register_buffer("adam_first", torch.zeros(num_tasks))
        self.register_buffer("adam_second", torch.zeros(num_tasks))
        self.register_buffer("adam_steps", torch.zeros(()))
        self.register_buffer("step_losses", torch.ones(num_tasks))
        """The losses of the current step (before the optimizer step)."""

    def weighted_loss(self, losses: Tensor) -> tuple[Tensor, Tensor]:
        shifted = losses + EPS
        z = torch.softmax(self.logits, dim=0).to(losses)
        scale = (z / shifted).sum().detach()
        self.step_losses.copy_(losses.detach())
        return (z * shifted.log()).sum() / scale, (z / (scale * shifted)).detach()

    def after_step(self, batch_losses: Callable[[], dict[str, Tensor]]) -> None:
        """One Adam step of the logits on delta = log L(theta_t) - log L(theta_{t+1})."""
        updated = batch_losses()
        new_losses = torch.stack([updated[name] for name in self.task_names]).detach()
        delta = (self.step_losses + EPS).log() - (new_losses.to(self.step_losses) + EPS).log()
        gradient = famo_logit_gradient(self.logits, delta) + self.gamma * self.logits
        beta1, beta2 = ADAM_BETAS
        self.adam_steps.add_(1)
        self.adam_first.mul_(beta1).add_(gradient, alpha=1 - beta1)
        self.adam_second.mul_(beta2).addcmul_(gradient, gradient, value=1 - beta2)
        first = self.adam_first / (1 - beta1**self.adam_steps)
        second = self.adam_second / (1 - beta2**self.adam_steps)
        self.logits.sub_(self.w_lr * first / (second.sqrt() + ADAM_EPS))
