"""GradNorm (Chen, Badrinarayanan, Lee & Rabinovich, ICML 2018, Algorithm 1).

The network follows sum_k w_k L_k with weights w_k (w(0) = 1). W is the last shared layer
(`StepContext.last_shared_parameters`). Per step t:

    G_k   = || d(w_k L_k)/dW ||_2 = w_k n_k,         n_k = || dL_k/dW ||_2
    r_k   = Ltilde_k / mean_j Ltilde_j,               Ltilde_k = L_k(t) / L_k(0)
    L_grad = sum_k | G_k - mean_j(G_j) * r_k^alpha |,

with the target mean_j(G_j) r_k^alpha held constant (Chen et al. Sec. 3.2), so
dL_grad/dw_k = sign(G_k - target_k) * n_k, computed in closed form: no second-order graph.
The initial losses L_k(0) are those of the first step (Chen et al.'s L_i(0)), kept in a buffer.

Weight update (a choice; Chen et al. only say "update w_i via the GradNorm gradient"): after
the network gradients are filled, one plain SGD step with its own step size `weight_lr`,
w <- w - weight_lr * dL_grad/dw, then floored at `MIN_WEIGHT` and renormalised so that
sum_k w_k = K (Algorithm 1's renormalisation). An internal step keeps the weights out of the
engine's optimizer, so Adam's per-parameter normalisation, weight decay and gradient clipping
never touch them, and the renormalisation happens right after each update. The weights used
for the network at step t are w(t); w(t+1) is used at the next step.

Cost: the n_k need dL_k/dW only (K `autograd.grad` calls that stop at W: cheap when W is one
layer, about a backward pass each when W is a large block), then one backward of
sum_k w_k L_k + extra_loss. The returned weights are w(t). The ReLiF term is added to the
weighted sum unweighted. Weights and initial losses are buffers, so they are checkpointed.

Representation mode (`gradient_source: representation`, an approximation, as LibMTL's
GradNorm with `rep_grad`, LibMTL/weighting/GradNorm.py): the gradient norms are taken against
the encoder output z instead of W, on the batch-summed representation gradients as LibMTL
does, G_k = || sum_b d(w_k L_k)/dz_b ||_2 (so n_k = G_k / w_k); K passes that stop at z
replace the K calls that stop at W. The network update is unchanged: the encoder receives one
backward of z with sum_k w_k dL_k/dz, which by the chain rule is exactly the gradient of
sum_k w_k L_k. Only the weights' trajectory differs from the parameters mode (through the
norms); at a given w(t) both modes give the same network gradient. See
`relif_ray.methods.gradients` for the construction.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from relif_ray.config import GradientSource
from relif_ray.methods.base import MTLMethod, StepContext
from relif_ray.methods.gradients import (
    backward_from_representation,
    batch_summed,
    encoder_output_of,
    per_task_gradients,
    representation_gradients,
)
from relif_ray.methods.registry import option_in_range, register

MIN_WEIGHT = 1e-6


def gradnorm_weight_gradient(
    weights: Tensor, grad_norms: Tensor, losses: Tensor, initial_losses: Tensor, alpha: float
) -> Tensor:
    """dL_grad/dw with the target mean(G) * r^alpha held constant (all inputs detached, (K,))."""
    norms_weighted = weights * grad_norms
    loss_ratios = losses / initial_losses
    relative_rates = loss_ratios / loss_ratios.mean()
    target = norms_weighted.mean() * relative_rates.pow(alpha)
    return torch.sign(norms_weighted - target) * grad_norms


@register
class GradNorm(MTLMethod):
    """Gradient normalisation of the task weights; see the module docstring."""

    name = "gradnorm"
    citation = "Chen et al., ICML 2018"
    capturable = True
    gradient_sources = ("parameters", "representation")

    def __init__(
        self,
        task_names: list[str],
        seed: int = 0,
        alpha: float = 1.5,
        weight_lr: float = 0.025,
        gradient_source: GradientSource = "parameters",
    ) -> None:
        super().__init__(task_names, seed=seed, gradient_source=gradient_source)
        self.alpha = option_in_range("alpha", alpha, ">= 0")
        self.weight_lr = option_in_range("weight_lr", weight_lr, "> 0")
        num_tasks = len(task_names)
        self.register_buffer("weights", torch.ones(num_tasks))
        self.register_buffer("initial_losses", torch.full((num_tasks,), math.nan))

    def backward(
        self, task_losses: dict[str, Tensor], ctx: StepContext, extra_loss: Tensor | None = None
    ) -> dict[str, Tensor]:
        losses = [task_losses[name] for name in self.task_names]
        used = self.weights.clone()
        if self.gradient_source == "representation":
            grad_norms = self._representation_backward(losses, used, ctx, extra_loss)
        else:
            grad_norms = self._parameters_backward(losses, used, ctx, extra_loss)
        loss_values = torch.stack(losses).detach().to(self.weights)
        first_step = torch.isnan(self.initial_losses)  # a mask, not a branch: no host sync
        self.initial_losses.copy_(torch.where(first_step, loss_values, self.initial_losses))

        step = gradnorm_weight_gradient(
            used, grad_norms, loss_values, self.initial_losses, self.alpha
        )
        updated = (used - self.weight_lr * step).clamp_min(MIN_WEIGHT)
        self.weights.copy_(updated * len(losses) / updated.sum())
        return dict(zip(self.task_names, used, strict=True))

    def _parameters_backward(
        self, losses: list[Tensor], used: Tensor, ctx: StepContext, extra_loss: Tensor | None
    ) -> Tensor:
        """n_k = ||dL_k/dW||, then one backward of sum_k w_k L_k (+ extra_loss)."""
        last_layer_grads = per_task_gradients(losses, ctx.last_shared_parameters)
        grad_norms = last_layer_grads.norm(dim=1).to(self.weights)
        total = torch.stack([w * loss for w, loss in zip(used, losses, strict=True)]).sum()
        if extra_loss is not None:
            total = total + extra_loss
        total.backward()
        return grad_norms

    def _representation_backward(
        self, losses: list[Tensor], used: Tensor, ctx: StepContext, extra_loss: Tensor | None
    ) -> Tensor:
        """n_k = ||sum_b dL_k/dz_b||, then one encoder backward of z with sum_k w_k dL_k/dz."""
        encoder_output = encoder_output_of(ctx, self.name)
        weighted = [w * loss for w, loss in zip(used, losses, strict=True)]
        gradients = representation_gradients(weighted, encoder_output, ctx.head_parameters)
        norms_weighted = batch_summed(gradients).norm(dim=1).to(self.weights)
        backward_from_representation(encoder_output, gradients.sum(0), extra_loss)
        return norms_weighted / used
