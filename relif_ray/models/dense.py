"""Dense multi-task model for NYUv2: a torchvision ResNet backbone shared by three heads.

The backbone runs at output stride 8, as in MTAN/LibMTL's dilated ResNet-50: for bottleneck
ResNets torchvision's `replace_stride_with_dilation` is used; basic-block ResNets (resnet18/34,
used for demos and tests) do not support dilation, so their layer3/layer4 simply keep stride 1.
Each head (`model.head: simple`) is conv3x3 -> BN -> ReLU (its "decoder feature map", whose
channel-wise L2 norm is the depth/normal audit score) -> conv1x1, upsampled bilinearly to the
input size; `model.head: aspp` is LibMTL's DeepLabV3 head (`relif_ray.models.aspp`).

Hard parameter sharing (`DenseMTLModel`) reads the encoder map with every head; every other
architecture (`DenseArchitectureModel`) is a trunk of `relif_ray.models.architectures` whose
per-task outputs the heads read.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relif_ray.config import ModelConfig
from relif_ray.errors import UserError, first_line
from relif_ray.models.aspp import AsppHead
from relif_ray.models.base import MultiTaskModel, TaskTrunk
from relif_ray.tasks.base import Batch, ModelOutput

TASK_CHANNELS = {"seg": 13, "depth": 1, "normal": 3}
BASIC_BLOCK_RESNETS = {"resnet18", "resnet34"}
BOTTLENECK_RESNETS = {"resnet50", "resnet101", "resnet152"}


IMAGENET_WEIGHTS = "IMAGENET1K_V1"
"""torchvision's original ImageNet weights, which every ResNet has (the ImageNet-initialised
encoder of LibMTL's NYUv2 setting; docs/nyuv2_setting.md)."""


def _torchvision_models() -> ModuleType:
    """`torchvision.models`, imported where a ResNet is built: importing torchvision takes a
    second (it imports torch._dynamo), which every sweep driver, CLI and clinical trial would
    otherwise pay for a model it never builds."""
    import torchvision.models

    return torchvision.models


def resnet_encoder(name: str, pretrained: str = "none") -> tuple[nn.Sequential, int]:
    """A ResNet without its classifier at output stride 8, and its output channel count;
    `pretrained` as in `ModelConfig` (none, imagenet or a state_dict path)."""
    if name not in BASIC_BLOCK_RESNETS | BOTTLENECK_RESNETS:
        known = ", ".join(sorted(BASIC_BLOCK_RESNETS | BOTTLENECK_RESNETS))
        raise UserError(f"config field model.backbone: unknown backbone '{name}' (known: {known})")
    builder = getattr(_torchvision_models(), name)
    if name in BOTTLENECK_RESNETS:
        net = builder(weights=None, replace_stride_with_dilation=[False, True, True])
    else:
        net = builder(weights=None)
        for layer in (net.layer3, net.layer4):
            layer[0].conv1.stride = (1, 1)
            layer[0].downsample[0].stride = (1, 1)
    if pretrained != "none":
        load_backbone_weights(net, name, pretrained)
    encoder = nn.Sequential(
        net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3, net.layer4
    )
    return encoder, net.fc.in_features


def resnet_stages(encoder: nn.Sequential) -> list[nn.Module]:
    """The five stages of a `resnet_encoder`: the stem (conv1, bn1, relu, maxpool), then
    layer1 to layer4 (the levels of MTAN, Cross-stitch and PLE)."""
    return [encoder[:4], *encoder[4:]]


def stage_shapes(encoder: nn.Sequential, image_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The (C, H, W) of an image of `image_shape` and of the outputs of the five stages of a
    `resnet_encoder`: each stage's channels are those of its last BatchNorm, and the stem and
    layer2 halve the size (the stem twice: conv1 and maxpool, each floor((h - 1) / 2) + 1),
    layer3 and layer4 keep it (output stride 8)."""

    def halved(size: int) -> int:
        return (size - 1) // 2 + 1

    channels = [
        [m for m in stage.modules() if isinstance(m, nn.BatchNorm2d)][-1].num_features
        for stage in resnet_stages(encoder)
    ]
    _, height, width = image_shape
    quarter = (halved(halved(height)), halved(halved(width)))
    eighth = (halved(quarter[0]), halved(quarter[1]))
    sizes = [quarter, quarter, eighth, eighth, eighth]
    return [tuple(image_shape)] + [(c, *size) for c, size in zip(channels, sizes, strict=True)]


def load_backbone_weights(net: nn.Module, name: str, pretrained: str) -> None:
    """Copy ImageNet weights ("imagenet") or a local state_dict file into the torchvision
    ResNet `net`. The file holds a state_dict of that ResNet (e.g. torchvision's own weight
    file); its classifier `fc.*`, which the encoder drops, may be present or not. A missing,
    unknown or wrongly shaped tensor is a one-line error naming it."""
    if pretrained == "imagenet":
        state, source = imagenet_state_dict(name), f"the ImageNet weights of {name}"
    else:
        state, source = read_state_dict(pretrained), pretrained
    expected = {key: value for key, value in net.state_dict().items() if not key.startswith("fc.")}
    given = {key: value for key, value in state.items() if not str(key).startswith("fc.")}
    prefix = f"config field model.pretrained: {source}"
    unknown = sorted(set(given) - set(expected), key=str)
    if unknown:
        raise UserError(f"{prefix} has a tensor '{unknown[0]}' that {name} does not have")
    # BatchNorm fills in a missing `num_batches_tracked` itself (older weight files lack it).
    missing = [
        key for key in expected if key not in given and not key.endswith("num_batches_tracked")
    ]
    if missing:
        raise UserError(f"{prefix} lacks {len(missing)} tensors of {name}, e.g. '{missing[0]}'")
    for key, value in given.items():
        if not isinstance(value, Tensor) or value.shape != expected[key].shape:
            shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise UserError(
                f"{prefix}: '{key}' has shape {shape}, {name} needs {tuple(expected[key].shape)}"
            )
    net.load_state_dict(given, strict=False)


def read_state_dict(path: str) -> dict[str, Tensor]:
    """A state_dict saved with `torch.save`, read with `weights_only=True`."""
    if not Path(path).is_file():
        raise UserError(
            f"config field model.pretrained: no such file: {path} (expected none, imagenet or "
            "the path of a state_dict file)"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise UserError(
            f"config field model.pretrained: {path} is not a torch state_dict file "
            f"({first_line(exc)})"
        ) from None
    if not isinstance(state, dict):
        raise UserError(
            f"config field model.pretrained: {path} holds a {type(state).__name__}, "
            "not a state_dict (a dict of tensors)"
        )
    return state


def imagenet_state_dict(name: str) -> dict[str, Tensor]:
    """torchvision's ImageNet weights of `name`, from its cache (the torch hub checkpoints
    folder) or downloaded there; without network access and without the cached file, a
    one-line error saying where to put it."""
    weights = _torchvision_models().get_model_weights(name)[IMAGENET_WEIGHTS]
    try:
        return weights.get_state_dict(
            progress=False, check_hash=True, map_location="cpu", weights_only=True
        )
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        target = Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name
        raise UserError(
            f"config field model.pretrained: ImageNet weights of {name} are neither cached nor "
            f"downloadable ({first_line(exc)}); put {weights.url} at {target}, or pass the "
            "path of a state_dict file"
        ) from None


class DenseHead(nn.Module):
    """conv3x3-BN-ReLU decoder feature map, then a 1x1 prediction layer (`model.head: simple`)."""

    align_corners = False
    """How the prediction is resized to the image (bilinear)."""

    def __init__(self, in_channels: int, head_channels: int, out_channels: int) -> None:
        super().__init__()
        self.decoder = nn.Sequential(
            nn.Conv2d(in_channels, head_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(head_channels),
            nn.ReLU(inplace=True),
        )
        self.predict = nn.Conv2d(head_channels, out_channels, 1)

    def forward(self, encoded: Tensor) -> tuple[Tensor, Tensor]:
        features = self.decoder(encoded)
        return self.predict(features), features


def dense_heads(config: ModelConfig, in_channels: int) -> nn.ModuleDict:
    """One head per NYUv2 task (`model.head`: simple or LibMTL's aspp), in task order."""
    head = AsppHead if config.head == "aspp" else DenseHead
    return nn.ModuleDict(
        {task: head(in_channels, config.head_channels, out) for task, out in TASK_CHANNELS.items()}
    )


def dense_predictions(
    heads: nn.ModuleDict, head_inputs: Mapping[str, Tensor], image: Tensor
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Each task's prediction at the image's size (normals L2-normalized) and its head's
    decoder feature map, from the tensor each head reads."""
    predictions: dict[str, Tensor] = {}
    features: dict[str, Tensor] = {}
    for task, head in heads.items():
        prediction, features[task] = head(head_inputs[task])
        predictions[task] = F.interpolate(
            prediction, size=image.shape[-2:], mode="bilinear", align_corners=head.align_corners
        )
    predictions["normal"] = F.normalize(predictions["normal"], dim=1)
    return predictions, features


def global_pool(feature_map: Tensor) -> Tensor:
    """(B, C, h, w) -> (B, C): the global average pool, the dense representation."""
    return torch.flatten(F.adaptive_avg_pool2d(feature_map, 1), 1)


class DenseMTLModel(MultiTaskModel):
    """Hard parameter sharing (`model.architecture: hps`): one ResNet encoder read by the
    seg/depth/normal heads; representation = GAP of the encoder map."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.encoder, channels = resnet_encoder(config.backbone, config.pretrained)
        self.heads = dense_heads(config, channels)

    def forward(self, batch: Batch) -> ModelOutput:
        image = batch["input"]
        encoded = self.encoder(image)
        predictions, features = dense_predictions(
            self.heads, dict.fromkeys(self.heads, encoded), image
        )
        return ModelOutput(
            predictions=predictions,
            representation=global_pool(encoded),
            features=features,
            encoder_output=encoded,
        )

    def shared_parameters(self) -> list[nn.Parameter]:
        return list(self.encoder.parameters())

    def last_shared_parameters(self) -> list[nn.Parameter]:
        """The last convolution of the encoder: GradNorm's W, "the last shared layer"."""
        return last_convolution(self.encoder)


class DenseArchitectureModel(MultiTaskModel):
    """Another architecture's trunk (`relif_ray.models.architectures`) with the NYUv2 heads;
    representation = the GAPs of the tasks' head inputs, concatenated in task order."""

    one_encoder_output = False

    def __init__(self, config: ModelConfig, trunk: TaskTrunk, channels: int) -> None:
        super().__init__()
        self.architecture = trunk.name
        self.trunk = trunk
        self.heads = dense_heads(config, channels)

    def forward(self, batch: Batch) -> ModelOutput:
        image = batch["input"]
        encoded = self.trunk(image)
        predictions, features = dense_predictions(self.heads, encoded.per_task, image)
        representation = torch.cat([global_pool(encoded.per_task[task]) for task in self.heads], 1)
        return ModelOutput(
            predictions=predictions,
            representation=representation,
            features=features,
            auxiliary_loss=encoded.auxiliary_loss,
        )

    def shared_parameters(self) -> list[nn.Parameter]:
        return self.trunk.shared_parameters()

    def last_shared_parameters(self) -> list[nn.Parameter]:
        return self.trunk.last_shared_parameters()


def last_convolution(module: nn.Module) -> list[nn.Parameter]:
    """The parameters of the last convolution of `module` (in module order)."""
    last_conv = [m for m in module.modules() if isinstance(m, nn.Conv2d)][-1]
    return list(last_conv.parameters())
