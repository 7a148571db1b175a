"""A plug-in MTL method: the Geometric Loss Strategy (Chennupati et al., CVPR Workshops 2019,
"MultiNet++"), L = (prod_k L_k)^(1/K), as LibMTL's GLS (LibMTL/weighting/GLS.py).

Put this file in a directory of its own and name that directory in RELIF_METHODS_PATH; then
`gls` (and `gls+relif`) is a method like the built-in ones, in configs, sweeps and their Ray
workers:

    mkdir -p my_methods && cp docs/examples/my_method.py my_methods/
    RELIF_METHODS_PATH=my_methods python sweeps/nyuv2.py --demo --methods erm,gls,gls+relif
"""

from torch import Tensor

from relif_ray.methods import LossWeighting, register


@register
class GeometricLoss(LossWeighting):
    """One backward of the geometric mean of the task losses (+ the ReLiF term, unweighted)."""

    name = "gls"
    citation = "Chennupati et al., CVPR Workshops 2019"

    def weighted_loss(self, losses: Tensor) -> tuple[Tensor, Tensor]:
        total = losses.log().mean().exp()  # (prod_k L_k)^(1/K), without overflow
        return total, total.detach() / (len(losses) * losses.detach())  # d total / d L_k
