"""LibMTL 1.1.5 (the LibMTL package on PyPI, a dev dependency) as an executable reference.

Its weighting classes (DWA, RLW, ...) are mixins of LibMTL's model: `backward(losses, **kwargs)`
reads `task_num`, `device` and, for DWA, `epoch` and `train_loss_buffer` from the instance, so
a bare instance with those attributes set runs the published code on our losses. The package's
`__init__` imports `torchvision.models.utils.load_state_dict_from_url`, which torchvision
moved to `torch.hub` in 0.13; `libmtl_module` provides that one name before the import.

Its architectures (`LibMTL.architecture.<name>`) take an `encoder_class` and build their
encoders by calling it; `libmtl_architecture` builds LibMTL's architecture of the same name as
one of our models ON THAT MODEL'S ENCODERS (each call of `encoder_class` returns the next of
our encoders or experts, as LibMTL would build them), so both share those weights, and copies
our values into the parameters LibMTL creates itself (attention modules, gates, cross-stitch
units). The same input then goes through both.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator

import torch
from torch import nn

from relif_ray.models.base import MultiTaskModel


def libmtl_module(name: str) -> types.ModuleType:
    """`importlib.import_module(name)` of a LibMTL module, with the torchvision name its
    package `__init__` still imports."""
    if "torchvision.models.utils" not in sys.modules:
        shim = types.ModuleType("torchvision.models.utils")
        shim.load_state_dict_from_url = torch.hub.load_state_dict_from_url
        sys.modules["torchvision.models.utils"] = shim
    return importlib.import_module(name)


def libmtl_weighting(name: str, task_num: int, **attributes: object) -> torch.nn.Module:
    """A LibMTL 1.1.5 weighting instance (`LibMTL.weighting.<name>`) for `task_num` tasks on
    the CPU, with the model attributes its `backward` reads."""
    weighting = getattr(libmtl_module("LibMTL.weighting"), name)()
    weighting.task_num = task_num
    weighting.device = torch.device("cpu")
    for key, value in attributes.items():
        setattr(weighting, key, value)
    return weighting


class ResNetView(nn.Module):
    """Five stages of one of our ResNet encoders (stem, layer1..4) under the attribute names
    LibMTL's architectures read (conv1, bn1, relu, maxpool, layer1..4, feature_dim), the very
    modules (no copy). Forward: the stages in turn. With LSTM levels (PLE on the clinical
    LSTM, `LevelOutputs` each), the stem is the first level and bn1, relu, maxpool are
    identities."""

    def __init__(self, stages: list[nn.Module], feature_dim: int) -> None:
        super().__init__()
        stem = stages[0]
        if isinstance(stem, nn.Sequential) and len(stem) == 4:
            self.conv1, self.bn1, self.relu, self.maxpool = stem
        else:
            self.conv1, self.bn1, self.relu, self.maxpool = (stem, *[nn.Identity()] * 3)
        for index, layer in enumerate(stages[1:], start=1):
            setattr(self, f"layer{index}", layer)
        self.feature_dim = feature_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for index in range(1, 5):
            x = getattr(self, f"layer{index}")(x)
        return x


class LevelOutputs(nn.Module):
    """An LSTM as LibMTL's experts are called, on stays of equal length: its outputs."""

    def __init__(self, lstm: nn.LSTM) -> None:
        super().__init__()
        self.lstm = lstm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


def _as_libmtl_encoder(module: nn.Module, feature_dim: int) -> nn.Module:
    """One of our experts as LibMTL calls it: a ResNet encoder as itself, an LSTM as its
    outputs, a PLE expert (its levels) as a `ResNetView`."""
    if isinstance(module, nn.LSTM):
        return LevelOutputs(module)
    if isinstance(module, nn.ModuleList):
        levels = [LevelOutputs(m) if isinstance(m, nn.LSTM) else m for m in module]
        return ResNetView(levels, feature_dim)
    return module


def libmtl_architecture(
    model: MultiTaskModel,
    decoders: dict[str, nn.Module],
    image_shape: tuple[int, ...],
) -> nn.Module:
    """LibMTL 1.1.5's architecture of `model.architecture`, on `model`'s encoders, with
    `decoders` as its heads (identities: its forward then returns each task's head input, our
    trunk's output) and the parameters it creates itself copied from `model`.
    `image_shape`: LibMTL's `img_size` (one example's input shape, which its gates flatten).
    LibMTL's PLE runs a random example through the shared experts as it is built; our state
    is put back afterwards, so the running statistics it touched are ours again."""
    state = {key: value.clone() for key, value in model.state_dict().items()}
    tasks = list(decoders)
    trunk = getattr(model, "trunk", None)
    encoders, kwargs = _libmtl_encoders(model, trunk, tasks)
    iterator: Iterator[nn.Module] = iter(encoders)
    name = LIBMTL_NAMES[model.architecture]
    arch_class = getattr(libmtl_module("LibMTL.architecture"), name)
    theirs = arch_class(
        task_name=tasks,
        encoder_class=lambda: next(iterator),
        decoders=nn.ModuleDict(decoders),
        rep_grad=False,
        multi_input=False,
        device=torch.device("cpu"),
        img_size=tuple(image_shape),
        **kwargs,
    )
    model.load_state_dict(state)
    _copy_architecture_parameters(model.architecture, trunk, theirs, tasks)
    return theirs


LIBMTL_NAMES = {
    "hps": "HPS",
    "mtan": "MTAN",
    "cross_stitch": "Cross_stitch",
    "mmoe": "MMoE",
    "cgc": "CGC",
    "ple": "PLE",
    "dselect_k": "DSelect_k",
}
"""Our architecture name -> LibMTL 1.1.5's class."""


def _libmtl_encoders(
    model: MultiTaskModel, trunk: nn.Module | None, tasks: list[str]
) -> tuple[list[nn.Module], dict]:
    """The modules LibMTL's `encoder_class` hands out, in the order LibMTL calls it, and the
    architecture's keyword arguments."""
    name = model.architecture
    if name == "hps":
        return [model.encoder], {}
    norms = [m for m in trunk.modules() if isinstance(m, nn.BatchNorm2d)]
    feature_dim = norms[-1].num_features if norms else 0  # LibMTL's MTAN: 2048 = bottleneck
    if name == "mtan":
        layers = [nn.Sequential(*body, last) for body, last in trunk.shared_layers]
        return [ResNetView([trunk.stem, *layers], feature_dim)], {}
    if name == "cross_stitch":
        columns = [[stage[task] for stage in trunk.stages] for task in tasks]
        return [ResNetView(column, feature_dim) for column in columns], {}
    if name in ("mmoe", "dselect_k"):
        experts = [_as_libmtl_encoder(e, feature_dim) for e in trunk.experts]
        kwargs: dict = {"num_experts": [len(experts)]}
        if name == "dselect_k":
            kwargs.update(num_nonzeros=trunk.num_nonzeros, kgamma=trunk.gamma)
        return experts, kwargs
    own = [len(trunk.specific[task]) for task in tasks]
    experts = [*trunk.shared, *(e for task in tasks for e in trunk.specific[task])]
    encoders = [_as_libmtl_encoder(e, feature_dim) for e in experts]
    return encoders, {"num_experts": [len(trunk.shared), *own]}


def _copy_architecture_parameters(
    name: str, trunk: nn.Module | None, theirs: nn.Module, tasks: list[str]
) -> None:
    """Our values of the parameters LibMTL's architecture creates itself."""
    if name == "mtan":
        for level, attention in enumerate(trunk.attention):
            for index, task in enumerate(tasks):
                theirs.encoder.encoder_att[str(level)][index].load_state_dict(
                    attention[task].state_dict()
                )
        for level, block in enumerate(trunk.block_attention):
            theirs.encoder.encoder_block_att[level].load_state_dict(block.state_dict())
    elif name == "cross_stitch":
        with torch.no_grad():
            for level, unit in enumerate(trunk.units):
                rows = torch.stack([unit[task] for task in tasks])
                if not torch.equal(rows, rows[:1].expand_as(rows)):
                    raise ValueError("LibMTL's cross-stitch unit has one row for all tasks")
                theirs.encoder.cross_unit[level].copy_(rows[0])
    elif name in ("mmoe", "cgc"):
        for task in tasks:
            theirs.gate_specific[task][0].load_state_dict(trunk.gates[task].linear.state_dict())
    elif name == "ple":
        for task in tasks:
            for level, gate in enumerate(trunk.gates[task]):
                theirs.encoder.gate_specific[task][level][0].load_state_dict(
                    gate.linear.state_dict()
                )
    elif name == "dselect_k":
        for task in tasks:
            theirs._z_logits[task].load_state_dict(trunk.selector_logits[task].state_dict())
            theirs._w_logits[task].load_state_dict(trunk.weight_logits[task].state_dict())
