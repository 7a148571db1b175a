"""relif-ray: ReLiF Lipschitz-fairness regularization for multi-task learning.

The library is plain torch/numpy; Ray is imported only by `relif_ray.tune`.
"""

__version__ = "0.1.0"
