"""A plug-in MTL method: the Geometric Loss Strategy (Chennupati et al., CVPR Workshops 2019,
"MultiNet++"), L = (prod_k L_k)^(1/K), as LibMTL's GLS (LibMTL/weighting/GLS.py).

Put this file in a directory of its own and name that directory in RELIF_METHODS_PATH; then
`gls` (and `gls+relif`) is a method like the built-in ones, in configs, sweeps and their Ray
workers:

    mkdir -p my_methods && cp docs/examples/my_method.py my_methods/
    RELIF_METHODS_PATH=my_methods python sweeps/nyuv2.py --demo --methods erm,gls,gls+relif
"""

import torch
from torch import Tensor

from relif_ray.methods import MTLMethod, StepContext, register


@register
class GeometricLoss(MTLMethod):
    """One backward of the geometric mean of the task losses (+ the ReLiF term, unweighted)."""

    name = "gls"
    citation = "Chennupati et al., CVPR Workshops 2019"

    def backward(
        self, task_losses: dict[str, Tensor], ctx: StepContext, extra_loss: Tensor | None = None
    ) -> dict[str, Tensor]:
        losses = torch.stack([task_losses[name] for name in self.task_names])
        total = losses.log().mean().exp()  # (prod_k L_k)^(1/K), without overflow
        (total if extra_loss is None else total + extra_loss).backward()
        weights = total.detach() / (len(losses) * losses.detach())  # d total / d L_k
        return dict(zip(self.task_names, weights, strict=True))
