"""Uncertainty weighting (Kendall, Gal & Cipolla, CVPR 2018).

Each task k has a learned log-variance s_k = log sigma_k^2 and the objective is

    L = sum_k ( 0.5 * exp(-s_k) * L_k + 0.5 * s_k ),

Kendall et al.'s Gaussian-likelihood form (their Eq. 7, 1/(2 sigma^2) L + log sigma, written in
s = log sigma^2 for numerical stability as the paper recommends). It is the form of LibMTL's
UW (LibMTL/weighting/UW.py), of the Nash-MTL code's `Uncertainty` (AvivNavon/nash-mtl,
methods/weight_methods.py) and of TorchJD's `UW` (torchjd/scalarization/_uw.py). We use it for
every task, including the classification ones (Kendall's Eq. 10 drops the 1/2 on those; the
single form keeps every task on the same footing and matches LibMTL, whose NYUv2 setting our
training follows).
For fixed L_k the optimum is s_k = log L_k, where task k's weight 0.5 exp(-s_k) is 1/(2 L_k).

The s_k are an `nn.Parameter` of this module, so the engine's optimizer updates them with the
network and they are in the checkpoint. Initialisation: s_k = 0 (sigma_k = 1, every weight
0.5) by default, as in the authors' example code (yaringal/multi-task-learning-example,
multi-task-learning-example-pytorch.ipynb) and TorchJD (LibMTL uses -0.5); it is
the `init_log_variance` option. The ReLiF term is added to L unweighted.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from relif_ray.config import GradientSource
from relif_ray.methods.base import LossWeighting
from relif_ray.methods.registry import option_in_range, register


@register
class Uncertainty(LossWeighting):
    """Homoscedastic-uncertainty task weighting with learned log-variances."""

    name = "uncertainty"
    citation = "Kendall, Gal & Cipolla, CVPR 2018"
    capturable = True

    def __init__(
        self,
        task_names: list[str],
        seed: int = 0,
        init_log_variance: float = 0.0,
        gradient_source: GradientSource = "parameters",
    ) -> None:
        super().__init__(task_names, seed=seed, gradient_source=gradient_source)
        init = option_in_range("init_log_variance", init_log_variance)
        self.log_variances = nn.Parameter(torch.full((len(task_names),), init))

    def weighted_loss(self, losses: Tensor) -> tuple[Tensor, Tensor]:
        """L = sum_k 0.5 exp(-s_k) L_k + 0.5 s_k (the module docstring's), and the weights."""
        weights = 0.5 * torch.exp(-self.log_variances)
        return (weights * losses + 0.5 * self.log_variances).sum(), weights.detach()
