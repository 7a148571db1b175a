"""LibMTL 1.1.5 (the LibMTL package on PyPI, a dev dependency) as an executable reference.

Its weighting classes (DWA, RLW, ...) are mixins of LibMTL's model: `backward(losses, **kwargs)`
reads `task_num`, `device` and, for DWA, `epoch` and `train_loss_buffer` from the instance, so
a bare instance with those attributes set runs the published code on our losses. The package's
`__init__` imports `torchvision.models.utils.load_state_dict_from_url`, which torchvision
moved to `torch.hub` in 0.13; `libmtl_weighting` provides that one name before the import.
"""

from __future__ import annotations

import importlib
import sys
import types

import torch


def libmtl_weighting(name: str, task_num: int, **attributes: object) -> torch.nn.Module:
    """A LibMTL 1.1.5 weighting instance (`LibMTL.weighting.<name>`) for `task_num` tasks on
    the CPU, with the model attributes its `backward` reads."""
    if "torchvision.models.utils" not in sys.modules:
        shim = types.ModuleType("torchvision.models.utils")
        shim.load_state_dict_from_url = torch.hub.load_state_dict_from_url
        sys.modules["torchvision.models.utils"] = shim
    weighting = getattr(importlib.import_module("LibMTL.weighting"), name)()
    weighting.task_num = task_num
    weighting.device = torch.device("cpu")
    for key, value in attributes.items():
        setattr(weighting, key, value)
    return weighting
