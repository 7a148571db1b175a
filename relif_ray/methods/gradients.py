"""Shared plumbing of the gradient-manipulating methods (PCGrad, FairGrad).

Both methods combine the per-task gradients on the shared parameters, g_k = dL_k/d theta_sh,
with task weights c (the aggregate is G^T c, G the K x P matrix of stacked g_k), while the
task-specific parameters get the gradient of sum_k v_k L_k for weights v that each method
documents. The ReLiF term extra_loss = lambda_t * L_lip enters AFTER aggregation: its gradient
is added unchanged to every parameter, never weighted or projected.

Cost per step: K `torch.autograd.grad` calls restricted to the shared parameters (the minimum
for per-task gradients) plus ONE ordinary backward of sum_k v_k L_k + extra_loss. That backward
fills every parameter (heads, the method's own, shared) in one pass; the shared parameters then
get G^T (c - v) added, which turns their G^T v into the aggregate G^T c while keeping the
extra_loss gradient. No extra forward pass is made.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


def per_task_gradients(losses: Sequence[Tensor], parameters: Sequence[nn.Parameter]) -> Tensor:
    """The K x P matrix whose row k is dL_k/d(parameters), flattened in parameter order.

    The graph is retained for the backward that follows. A parameter that a loss does not
    depend on contributes zeros to that loss's row.
    """
    sizes = [p.numel() for p in parameters]
    first = parameters[0]
    matrix = torch.zeros(len(losses), sum(sizes), dtype=first.dtype, device=first.device)
    for row, loss in enumerate(losses):
        grads = torch.autograd.grad(loss, parameters, retain_graph=True, allow_unused=True)
        for chunk, grad in zip(matrix[row].split(sizes), grads, strict=True):
            if grad is not None:
                chunk.copy_(grad.reshape(-1))
    return matrix


def add_to_grads(parameters: Sequence[nn.Parameter], vector: Tensor) -> None:
    """Add a flat vector (laid out as in `per_task_gradients`) into the parameters' .grad."""
    chunks = vector.split([p.numel() for p in parameters])
    for param, chunk in zip(parameters, chunks, strict=True):
        update = chunk.view_as(param)
        if param.grad is None:
            param.grad = update.clone()
        else:
            param.grad.add_(update)


def backward_weighted(
    task_losses: Sequence[Tensor],
    gradients: Tensor,
    shared_parameters: Sequence[nn.Parameter],
    shared_weights: Tensor,
    head_weights: Tensor,
    extra_loss: Tensor | None,
) -> None:
    """Fill .grad: shared = G^T c + d extra/d theta_sh, others = d(sum_k v_k L_k + extra).

    c = shared_weights, v = head_weights.

    `gradients` is G from `per_task_gradients(task_losses, shared_parameters)`; the weights are
    (K,) tensors (moved to G's dtype and device). One backward pass; see the module docstring.
    """
    shared_weights = shared_weights.to(dtype=gradients.dtype, device=gradients.device)
    head_weights = head_weights.to(dtype=gradients.dtype, device=gradients.device)
    total = torch.stack([v * loss for v, loss in zip(head_weights, task_losses, strict=True)]).sum()
    if extra_loss is not None:
        total = total + extra_loss
    total.backward()
    correction = shared_weights - head_weights
    if bool(torch.any(correction != 0)):
        add_to_grads(shared_parameters, correction @ gradients)
