"""Gradient aggregation: the per-task gradient pass and write-back shared by PCGrad and FairGrad.

A `GradientAggregator` (as TorchJD's aggregators) is the whole method except its weighting:
it takes the per-task gradients, forms the K x K Gramian G G^T, asks the subclass for task
weights c from the Gramian alone (`weighting`), and writes the shared update G^T c back. A
method module then only defines its weighting (PCGrad's projection, FairGrad's fixed point).
GradNorm uses `per_task_gradients` for its norms but is a weighted sum, not an aggregator.

Parameter gradients (`gradient_source: parameters`, exact). PCGrad and FairGrad combine the
per-task gradients on the shared parameters, g_k = dL_k/d theta_sh, into one update, while
every task-specific parameter gets the plain sum of the task losses' gradients. The ReLiF term
extra_loss = lambda_t * L_lip enters AFTER aggregation: its gradient is added unchanged to
every parameter, never weighted or projected.

Cost per step (`backward_per_task`, then the ReLiF term's backward): K backward passes, one
per task loss, then one more only for extra_loss when ReLiF is on. Pass k reaches the heads of
task k and the shared parameters; its shared gradient becomes row k of G and is cleared from
.grad, while the task-specific gradients stay and add up across passes. So each head is
traversed once (as in ERM) and the backbone K times; there is no extra forward pass and no
extra pass that would recompute the task-specific gradients. (Taking the g_k with
`torch.autograd.grad` restricted to the shared parameters would need a further full backward
for the heads.)

Representation gradients (`gradient_source: representation`, an approximation). The mode of
LibMTL's `rep_grad` (LibMTL's LibMTL/architecture/abstract_arch.py and
LibMTL/weighting/abstract_weighting.py): the per-task gradients are taken with respect to the
encoder output z (B x ...) that every head consumes, r_k = dL_k/dz, instead of the shared
parameters (`representation_gradients`: K passes that stop at z, so each head is traversed
once and the encoder not at all). As in LibMTL, the weighting sees the batch-summed rows
rbar_k = sum_b r_k[b] (its Gramian or norms), and the chosen weights c are applied to the
full per-example gradients: the encoder receives ONE backward of z with sum_k c_k r_k
(`backward_from_representation`), which also carries the ReLiF term's exact gradient, so
the step costs about one ERM backward plus K head passes.

Why it is an approximation, and only in the weights: the exact shared gradient is
g_k = J^T r_k (J = dz/d theta_sh, over the whole batch), so the written-back update
J^T (sum_k c_k r_k) = sum_k c_k g_k = G^T c is exactly the aggregation G^T c FOR the weights
c; but c is computed from rbar_k . rbar_j = r_k^T (1 1^T (x) I) r_j instead of the exact
Gramian r_k^T J J^T r_j, i.e. J J^T is replaced by an identity block for every pair of
examples. The two modes agree when J J^T has that form, e.g. when z = h + b and only the bias
b is shared (tested), and for a single task. Guarantees stated on the shared parameters
(PCGrad's two-task non-conflict) then hold for the batch-summed representation gradients
instead. LibMTL's own PCGrad and FairGrad refuse `rep_grad`; PCGrad's representation mode
here is our extension of the same construction (the weighting is unchanged, only its input
differs), and FairGrad has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from relif_ray.errors import UserError
from relif_ray.methods.base import GRADIENT_AGGREGATION, MTLMethod, StepContext


def _flat_layout(parameters: Sequence[nn.Parameter], num_rows: int) -> tuple[Tensor, list[int]]:
    sizes = [p.numel() for p in parameters]
    first = parameters[0]
    return torch.zeros(num_rows, sum(sizes), dtype=first.dtype, device=first.device), sizes


def grad_like(param: nn.Parameter, values: Tensor) -> Tensor:
    """A new .grad for `param` holding `values`, in the parameter's own memory layout, as
    autograd lays out the gradients it accumulates: a contiguous gradient of a channels-last
    convolution would be refused by the fused optimiser on CUDA (its moments are made like
    the weights)."""
    return torch.empty_like(param).copy_(values)


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


def representation_gradients(
    losses: Sequence[Tensor], encoder_output: Tensor, head_parameters: Sequence[nn.Parameter]
) -> Tensor:
    """Stack the r_k = dL_k/dz, (K, *z.shape); add each loss's head gradients into .grad.

    Each pass stops at z (`torch.autograd.grad` runs only the graph between the loss and its
    inputs), so the encoder is not traversed. The graph is retained for the one backward
    through the encoder that follows. A loss that does not reach z contributes a zero row.
    """
    rows = []
    for loss in losses:
        grads = torch.autograd.grad(
            loss, [encoder_output, *head_parameters], retain_graph=True, allow_unused=True
        )
        rows.append(torch.zeros_like(encoder_output) if grads[0] is None else grads[0])
        for param, grad in zip(head_parameters, grads[1:], strict=True):
            if grad is None:
                continue
            if param.grad is None:
                param.grad = grad_like(param, grad)
            else:
                param.grad.add_(grad)
    return torch.stack(rows)


def batch_summed(gradients: Tensor) -> Tensor:
    """(K, B, ...) representation gradients -> (K, D) rows summed over the batch (LibMTL's),
    accumulated in at least fp32 (the gradients are bf16 under bf16 autocast)."""
    rows = gradients.reshape(gradients.shape[0], gradients.shape[1], -1)
    return rows.sum(1, dtype=torch.promote_types(gradients.dtype, torch.float32))


def backward_from_representation(
    encoder_output: Tensor, update: Tensor, extra_loss: Tensor | None
) -> None:
    """One backward through the encoder with `update` at z, plus the ReLiF term's gradient.

    Both start in the same backward, so the encoder is traversed once; the ReLiF gradient
    reaching z adds to `update` unchanged (it is never weighted or projected).
    """
    if extra_loss is None:
        encoder_output.backward(update)
    else:
        torch.autograd.backward([encoder_output, extra_loss], [update, torch.ones_like(extra_loss)])


def encoder_output_of(ctx: StepContext, method: str) -> Tensor:
    """The context's encoder output, or a one-line error when the model does not expose it."""
    if ctx.encoder_output is None:
        raise UserError(
            f"method.gradient_source: {method} in 'representation' mode needs a model that "
            "returns its encoder output (ModelOutput.encoder_output)"
        )
    return ctx.encoder_output


def add_to_grads(parameters: Sequence[nn.Parameter], vector: Tensor) -> None:
    """Add a flat vector (laid out as in `per_task_gradients`) into the parameters' .grad."""
    chunks = vector.split([p.numel() for p in parameters])
    for param, chunk in zip(parameters, chunks, strict=True):
        update = chunk.view_as(param)
        if param.grad is None:
            param.grad = grad_like(param, update)
        else:
            param.grad.add_(update)


def finish_backward(
    shared_parameters: Sequence[nn.Parameter], update: Tensor, extra_loss: Tensor | None
) -> None:
    """Write the aggregated shared update, then add the ReLiF term's gradient everywhere."""
    add_to_grads(shared_parameters, update)
    if extra_loss is not None:
        extra_loss.backward()


@dataclass
class PendingUpdate:
    """A gradient-aggregation step between its two device parts: the K x P shared-parameter
    gradients G, their K x K Gramian G G^T (in G's dtype, on the device) for the host solve,
    and the shared parameters the update G^T c goes to."""

    gradients: Tensor
    gramian: Tensor
    parameters: list[nn.Parameter]


class GradientAggregator(MTLMethod):
    """A method whose shared update is G^T c with task weights c computed from G G^T.

    Subclasses implement `weighting`. The task-specific parameters get the plain sum of the
    task losses' gradients; the ReLiF term's gradient is added after aggregation. A subclass
    that lists "representation" in `gradient_sources` runs the same weighting on the
    batch-summed representation gradients (see the module docstring).

    With parameter gradients the step splits at its host solve (`splits_at_host_solve`): a
    device part before it (`gradients_before_solve`: the K passes, the ReLiF term's backward,
    the Gramian), the solve on the host (`solve`: c from the K x K Gramian, the only value the
    host reads), and a device part after it (`update_after_solve`: the write-back of G^T c).
    `backward` runs the three in a row; on CUDA each device part may be one CUDA graph
    (`relif_ray.cuda_graph.SolvedGraphedStep`), so only the solve runs on the host. The ReLiF
    term's gradient is accumulated before the update is added: floating-point addition is
    commutative, so the sum is the same as adding it after.
    """

    kind = GRADIENT_AGGREGATION
    eager_reason = (
        "uses the representation gradient source: its encoder backward follows the host "
        "solve, so no part of the step is graphed"
    )

    def weighting(self, gramian: Tensor) -> Tensor:
        """The (K,) float64 task weights c for the float64 Gramian G G^T (task order)."""
        raise NotImplementedError

    def solve(self, gramian: Tensor) -> Tensor:
        """The host part: the (K,) float64 task weights c from the Gramian G G^T on the host
        (in the gradients' dtype). A method whose weights need more than `weighting` of the
        float64 Gramian (TorchJD's Nash-MTL) overrides this, with `scaled_weights`."""
        return self.weighting(gramian.double())

    def scaled_weights(self, weights: Tensor, gradients: Tensor) -> Tensor:
        """The device part of the weighting after the solve: the weights `solve` gave, now on
        the device, and G; unchanged here (Nash-MTL scales them to a bounded update)."""
        return weights

    def splits_at_host_solve(self) -> bool:
        return self.gradient_source == "parameters"

    def backward(
        self, task_losses: dict[str, Tensor], ctx: StepContext, extra_loss: Tensor | None = None
    ) -> dict[str, Tensor]:
        """Fill `.grad` with the aggregated update; return the weights c."""
        if self.gradient_source == "representation":
            losses = [task_losses[name] for name in self.task_names]
            return self._by_task(self._representation_backward(losses, ctx, extra_loss))
        pending = self.gradients_before_solve(task_losses, ctx, extra_loss)
        solved = self.solve(pending.gramian.cpu()).to(pending.gradients.device)
        return self.update_after_solve(pending, solved)

    def _by_task(self, weights: Tensor) -> dict[str, Tensor]:
        """The weights c as `backward` returns them: fp32, by task name."""
        return dict(zip(self.task_names, weights.float(), strict=True))

    def gradients_before_solve(
        self, task_losses: dict[str, Tensor], ctx: StepContext, extra_loss: Tensor | None
    ) -> PendingUpdate:
        """The device part before the solve: G from the K per-task passes (the heads' .grad
        then hold the plain sum), the ReLiF term's backward, and G G^T."""
        losses = [task_losses[name] for name in self.task_names]
        gradients = backward_per_task(losses, ctx.shared_parameters, extra_loss is not None)
        if extra_loss is not None:
            extra_loss.backward()
        return PendingUpdate(gradients, gradients @ gradients.T, list(ctx.shared_parameters))

    def update_after_solve(self, pending: PendingUpdate, weights: Tensor) -> dict[str, Tensor]:
        """The device part after the solve: the solved weights (a device tensor) scaled, and
        G^T c added to the shared parameters' .grad; the weights c used, as `backward`
        returns them."""
        weights = self.scaled_weights(weights, pending.gradients)
        add_to_grads(pending.parameters, weights.to(pending.gradients) @ pending.gradients)
        return self._by_task(weights)

    def _representation_backward(
        self, losses: list[Tensor], ctx: StepContext, extra_loss: Tensor | None
    ) -> Tensor:
        encoder_output = encoder_output_of(ctx, self.name)
        gradients = representation_gradients(losses, encoder_output, ctx.head_parameters)
        rows = batch_summed(gradients)
        weights = self.scaled_weights(self.solve((rows @ rows.T).cpu()).to(rows.device), rows)
        update = torch.tensordot(weights.to(gradients), gradients, dims=1)
        backward_from_representation(encoder_output, update, extra_loss)
        return weights
