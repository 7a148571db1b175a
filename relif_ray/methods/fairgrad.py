"""FairGrad (Ban & Ji, ICML 2024, "Fair Resource Allocation in Multi-Task Learning").

The shared update is d = G^T w (G: K x P per-task gradients on the shared parameters), with
alpha-fair weights w > 0 solving the fixed point of the paper's Eq. 4,

    (G G^T) w = w^(-1/alpha)        (elementwise power),

found with `scipy.optimize.least_squares` on that residual with bounds w >= 0 from the uniform
start 1/K, as the official FairGrad code (OptMN-Lab/fairgrad, methods/weight_methods.py) does.
For conditioning the system is solved with the Gramian scaled to unit Frobenius norm: if
A w = w^(-1/alpha) then (cA) w' = w'^(-1/alpha) for w' = c^(-alpha/(1+alpha)) w, so the
solution is rescaled exactly afterwards.

alpha (default 2.0, the value of the paper's experiments) selects the fairness: alpha -> 0 is
utilitarian (linear scalarisation), alpha = 1 proportional fairness, alpha -> inf max-min. The
equation is undefined at alpha = 0; there we use equal weights w_k = 1, i.e. exactly ERM's
equal-weight sum (TorchJD uses 1/K; only the step scale differs).

Task-specific parameters (the paper only defines the shared update) get the plain sum of the
task losses' gradients, as the official code does: it backpropagates each L_k unweighted and
overwrites only the shared parameters' gradients. (LibMTL's FairGrad, in LibMTL's
LibMTL/weighting/FairGrad.py, instead backpropagates sum_k w_k L_k, weighting the heads by w;
that would cost one more full backward pass here.)
The official code also multiplies the shared update by K and clips it to norm 1; neither is in
the paper's algorithm and neither is done here (the engine's `train.grad_clip` clips).
The ReLiF term's gradient is added after aggregation. Passes and write-back:
`relif_ray.methods.gradients.GradientAggregator`. The returned per-task weights are w.

Non-conflict: at the fixed point g_k . d = (G G^T w)_k = w_k^(-1/alpha) > 0 for every task,
for any K and alpha > 0 (alpha = 0 is the plain sum, which can conflict).

No representation mode: LibMTL's FairGrad refuses `rep_grad` and none is defined elsewhere,
so `gradient_source: representation` is a one-line config error.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from relif_ray.config import GradientSource
from relif_ray.methods.gradients import GradientAggregator
from relif_ray.methods.registry import option_in_range, register


def fairgrad_weights(gramian: np.ndarray, alpha: float) -> np.ndarray:
    """The w > 0 with gramian @ w = w^(-1/alpha).

    Ones when alpha == 0, and when all gradients are zero (no solution exists; the shared
    update G^T w is zero for any w).
    """
    # deferred: scipy.optimize takes 0.2 s to import, paid by every process that loads the
    # method registry (trial workers, drivers, `relif` commands) whether or not it runs FairGrad
    from scipy.optimize import least_squares

    num_tasks = gramian.shape[0]
    scale = float(np.linalg.norm(gramian))
    if alpha == 0 or scale == 0.0:
        return np.ones(num_tasks)
    scaled = gramian / scale

    def residual(w: np.ndarray) -> np.ndarray:
        return scaled @ w - np.power(w, -1.0 / alpha)

    def jacobian(w: np.ndarray) -> np.ndarray:
        return scaled + np.diag(np.power(w, -1.0 / alpha - 1.0) / alpha)

    start = np.full(num_tasks, 1.0 / num_tasks)
    solution = least_squares(residual, start, jac=jacobian, bounds=(0.0, np.inf)).x
    return solution * scale ** (-alpha / (1.0 + alpha))


@register
class FairGrad(GradientAggregator):
    """alpha-fair task weights on the shared gradients; see the module docstring."""

    name = "fairgrad"
    citation = "Ban & Ji, ICML 2024"

    def __init__(
        self,
        task_names: list[str],
        seed: int = 0,
        alpha: float = 2.0,
        gradient_source: GradientSource = "parameters",
    ) -> None:
        super().__init__(task_names, seed=seed, gradient_source=gradient_source)
        self.alpha = option_in_range("alpha", alpha, ">= 0")

    def weighting(self, gramian: Tensor) -> Tensor:
        return torch.from_numpy(fairgrad_weights(gramian.cpu().numpy(), self.alpha))

    def promises_non_conflict(self) -> bool:
        return self.alpha > 0
