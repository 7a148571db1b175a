"""Problem loaders by data set name (`data.dataset`); importing this module registers them."""

from __future__ import annotations

import torch

from relif_ray.data import eicu, mimic3  # noqa: F401  (register "eicu" and "mimic3")
from relif_ray.data.nyuv2 import read_nyuv2
from relif_ray.models.dense import DenseMTLModel
from relif_ray.problem import Problem, TensorSplit, register_problem
from relif_ray.tasks.nyuv2 import nyuv2_tasks


@register_problem("nyuv2")
def load_nyuv2_problem(root: str) -> Problem:
    """NYUv2 in the MTAN/LibMTL layout, read once per process and held in memory.

    Segmentation labels (-1..12) are held as int8, an eighth of the reader's int64 and
    lossless; the tasks cast them where they index (cross-entropy, confusion matrix). Images,
    depth and normals stay float32: they are not integral, so a smaller dtype would round them.
    """
    splits = {}
    for name, arrays in read_nyuv2(root).items():
        splits[name] = TensorSplit(
            {
                "input": arrays["image"],
                "seg": arrays["label"].to(torch.int8),
                "depth": arrays["depth"],
                "normal": arrays["normal"],
                "example_id": arrays["example_id"],
            }
        )
    return Problem("nyuv2", nyuv2_tasks(), splits, DenseMTLModel)
