"""relif-ray: ReLiF Lipschitz-fairness regularization for multi-task learning.

The library is plain torch/numpy; Ray is imported only by the Tune layer, `relif_ray.tuning`.
"""

__version__ = "0.1.0.dev0"
