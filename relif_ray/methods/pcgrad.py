"""PCGrad (Yu et al., NeurIPS 2020, "Gradient Surgery for Multi-Task Learning", Algorithm 1).

For every task i, g_i^PC starts at g_i; for every other task j, in a random order, if
g_i^PC . g_j < 0 the conflicting component is removed: g_i^PC -= (g_i^PC . g_j / |g_j|^2) g_j.
The shared update is sum_i g_i^PC (the summed form of Algorithm 1).

Every g_i^PC is a linear combination of the g_j, so the projection runs on the K x K Gramian
G G^T and yields weights c with sum_i g_i^PC = G^T c (the same reformulation as TorchJD's
`PCGradWeighting`, torchjd/aggregation/_pcgrad.py); the P-dimensional gradients are touched
only to form G G^T and G^T c, by `relif_ray.methods.gradients.GradientAggregator`.

Randomness: following Algorithm 1 literally, a fresh random order of the other tasks is drawn
for every task i, at every step, from the method's own `torch.Generator` seeded with the run's
seed; its state is in the module's state_dict (extra state), so a resumed run draws the same
orders as an uninterrupted one.

Task-specific parameters get the plain sum of the task losses' gradients (as in Yu et al., who
project only the shared parameters' gradients). The ReLiF term's gradient is added after the
projection. Passes: see `relif_ray.methods.gradients`. The returned per-task weights are c.

Non-conflict: for two conflicting tasks the projections make g_1^PC orthogonal to g_2 and
g_2^PC to g_1, so g_1 . d = |g_1|^2 - (g_1 . g_2)^2 / |g_2|^2 >= 0 (Cauchy-Schwarz), and
likewise for g_2; without conflict d = g_1 + g_2. For more tasks there is no such guarantee.

Representation mode (`gradient_source: representation`, an approximation and our extension:
LibMTL's PCGrad refuses `rep_grad`): the same weighting on the Gramian of the batch-summed
gradients with respect to the encoder output, written back through one encoder backward; see
`relif_ray.methods.gradients`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from relif_ray.config import GradientSource
from relif_ray.methods.gradients import GradientAggregator
from relif_ray.methods.registry import register


def pcgrad_weights(gramian: list[list[float]], orders: list[list[int]]) -> list[float]:
    """Weights c with sum_i g_i^PC = sum_j c_j g_j, given Gramian[i][j] = g_i . g_j.

    orders[i] is the order in which task i is projected against the other tasks (i itself, if
    listed, is skipped). coefficients[m] holds g_i^PC's coefficient on g_m.
    """
    num_tasks = len(gramian)
    weights = [0.0] * num_tasks
    for i in range(num_tasks):
        coefficients = [0.0] * num_tasks
        coefficients[i] = 1.0
        for j in orders[i]:
            if j == i:
                continue
            inner = sum(gramian[j][m] * coefficients[m] for m in range(num_tasks))
            if inner < 0.0:
                coefficients[j] -= inner / gramian[j][j]
        weights = [w + c for w, c in zip(weights, coefficients, strict=True)]
    return weights


@register
class PCGrad(GradientAggregator):
    """Projecting conflicting gradients on the shared parameters, in a seeded random order."""

    name = "pcgrad"
    citation = "Yu et al., NeurIPS 2020"
    gradient_sources = ("parameters", "representation")

    def __init__(
        self, task_names: list[str], seed: int = 0, gradient_source: GradientSource = "parameters"
    ) -> None:
        super().__init__(task_names, seed=seed, gradient_source=gradient_source)
        self.generator = torch.Generator().manual_seed(seed)

    def draw_orders(self) -> list[list[int]]:
        """One random permutation of the tasks per task i (Algorithm 1's inner loop order)."""
        num_tasks = len(self.task_names)
        return [
            torch.randperm(num_tasks, generator=self.generator).tolist() for _ in range(num_tasks)
        ]

    def weighting(self, gramian: Tensor) -> Tensor:
        weights = pcgrad_weights(gramian.tolist(), self.draw_orders())
        return torch.tensor(weights, dtype=torch.float64)

    def promises_non_conflict(self) -> bool:
        return len(self.task_names) == 2 and self.gradient_source == "parameters"

    def get_extra_state(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
