"""Problem loaders by data set name (`data.dataset`); importing this module registers them."""

from __future__ import annotations

from relif_ray.data import eicu, mimic3  # noqa: F401  (register "eicu" and "mimic3")
from relif_ray.data.nyuv2 import read_nyuv2
from relif_ray.models.dense import DenseMTLModel
from relif_ray.problem import Problem, TensorSplit, register_problem
from relif_ray.tasks.nyuv2 import nyuv2_tasks


@register_problem("nyuv2")
def load_nyuv2_problem(root: str) -> Problem:
    """NYUv2 in the MTAN/LibMTL layout, read once and held in memory."""
    splits = {}
    for name, arrays in read_nyuv2(root).items():
        splits[name] = TensorSplit(
            {
                "input": arrays["image"],
                "seg": arrays["label"],
                "depth": arrays["depth"],
                "normal": arrays["normal"],
                "example_id": arrays["example_id"],
            }
        )
    return Problem("nyuv2", nyuv2_tasks(), splits, DenseMTLModel)
