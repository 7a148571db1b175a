"""Gradient aggregation: the per-task gradient pass and write-back shared by PCGrad and FairGrad.

A `GradientAggregator` (as TorchJD's aggregators) is the whole method except its weighting:
it takes the per-task gradients, forms the K x K Gramian G G^T, asks the subclass for task
weights c from the Gramian alone (`weighting`), and writes the shared update G^T c back. A
method module then only defines its weighting (PCGrad's projection, FairGrad's fixed point).
GradNorm uses `per_task_gradients` for its norms but is a weighted sum, not an aggregator.

PCGrad and FairGrad combine the per-task gradients on the shared parameters,
g_k = dL_k/d theta_sh, into one update, while every task-specific parameter gets the plain
sum of the task losses' gradients. The ReLiF term extra_loss = lambda_t * L_lip enters AFTER
aggregation: its gradient is added unchanged to every parameter, never weighted or projected.

Cost per step (`backward_per_task` + `finish_backward`): K backward passes, one per task loss,
then one more only for extra_loss when ReLiF is on. Pass k reaches the heads of task k and the
shared parameters; its shared gradient becomes row k of G and is cleared from .grad, while the
task-specific gradients stay and add up across passes. So each head is traversed once (as in
ERM) and the backbone K times; there is no extra forward pass and no extra pass that would
recompute the task-specific gradients. (Taking the g_k with `torch.autograd.grad` restricted
to the shared parameters would need a further full backward for the heads.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from relif_ray.methods.base import MTLMethod, StepContext


def _flat_layout(parameters: Sequence[nn.Parameter], num_rows: int) -> tuple[Tensor, list[int]]:
    sizes = [p.numel() for p in parameters]
    first = parameters[0]
    return torch.zeros(num_rows, sum(sizes), dtype=first.dtype, device=first.device), sizes


def per_task_gradients(losses: Sequence[Tensor], parameters: Sequence[nn.Parameter]) -> Tensor:
    """The K x P matrix whose row k is dL_k/d(parameters), flattened in parameter order.

    Uses `torch.autograd.grad`, so no .grad is touched and the graph is retained; the passes
    stop at `parameters` (GradNorm uses this on the last shared layer only). A parameter that
    a loss does not depend on contributes zeros to that loss's row.
    """
    matrix, sizes = _flat_layout(parameters, len(losses))
    for row, loss in enumerate(losses):
        grads = torch.autograd.grad(loss, parameters, retain_graph=True, allow_unused=True)
        for chunk, grad in zip(matrix[row].split(sizes), grads, strict=True):
            if grad is not None:
                chunk.copy_(grad.reshape(-1))
    return matrix


def backward_per_task(
    losses: Sequence[Tensor], shared_parameters: Sequence[nn.Parameter], keep_graph: bool
) -> Tensor:
    """Backpropagate each loss on its own; return G, the K x P shared-parameter gradients.

    Afterwards every non-shared parameter's .grad holds sum_k dL_k/dp (accumulated on top of
    what it held), and the shared parameters' .grad is None. `keep_graph` keeps the graph after
    the last pass (needed when extra_loss is backpropagated next).
    """
    matrix, sizes = _flat_layout(shared_parameters, len(losses))
    for param in shared_parameters:
        param.grad = None
    for row, loss in enumerate(losses):
        loss.backward(retain_graph=keep_graph or row < len(losses) - 1)
        for chunk, param in zip(matrix[row].split(sizes), shared_parameters, strict=True):
            if param.grad is not None:
                chunk.copy_(param.grad.reshape(-1))
                param.grad = None
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


def finish_backward(
    shared_parameters: Sequence[nn.Parameter], update: Tensor, extra_loss: Tensor | None
) -> None:
    """Write the aggregated shared update, then add the ReLiF term's gradient everywhere."""
    add_to_grads(shared_parameters, update)
    if extra_loss is not None:
        extra_loss.backward()


class GradientAggregator(MTLMethod):
    """A method whose shared update is G^T c with task weights c computed from G G^T.

    Subclasses implement `weighting`. The task-specific parameters get the plain sum of the
    task losses' gradients; the ReLiF term's gradient is added after aggregation.
    """

    def weighting(self, gramian: Tensor) -> Tensor:
        """The (K,) float64 task weights c for the float64 Gramian G G^T (task order)."""
        raise NotImplementedError

    def backward(
        self, task_losses: dict[str, Tensor], ctx: StepContext, extra_loss: Tensor | None = None
    ) -> dict[str, Tensor]:
        """Fill `.grad` with G^T c on the shared parameters; return the weights c."""
        losses = [task_losses[name] for name in self.task_names]
        gradients = backward_per_task(losses, ctx.shared_parameters, extra_loss is not None)
        weights = self.weighting((gradients @ gradients.T).double())
        finish_backward(ctx.shared_parameters, weights.to(gradients) @ gradients, extra_loss)
        return dict(zip(self.task_names, weights.float(), strict=True))
