"""Dense multi-task model for NYUv2: a torchvision ResNet backbone shared by three heads.

The backbone runs at output stride 8, as in MTAN/LibMTL's dilated ResNet-50: for bottleneck
ResNets torchvision's `replace_stride_with_dilation` is used; basic-block ResNets (resnet18/34,
used for demos and tests) do not support dilation, so their layer3/layer4 simply keep stride 1.
Each head is conv3x3 -> BN -> ReLU (its "decoder feature map", whose channel-wise L2 norm is
the depth/normal audit score) -> conv1x1, upsampled bilinearly to the input size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn

from relif_ray.config import ModelConfig
from relif_ray.errors import UserError
from relif_ray.models.base import MultiTaskModel
from relif_ray.tasks.base import Batch, ModelOutput

TASK_CHANNELS = {"seg": 13, "depth": 1, "normal": 3}
BASIC_BLOCK_RESNETS = {"resnet18", "resnet34"}
BOTTLENECK_RESNETS = {"resnet50", "resnet101", "resnet152"}


def resnet_encoder(name: str, pretrained: bool) -> tuple[nn.Sequential, int]:
    """A ResNet without its classifier at output stride 8, and its output channel count."""
    if name not in BASIC_BLOCK_RESNETS | BOTTLENECK_RESNETS:
        known = ", ".join(sorted(BASIC_BLOCK_RESNETS | BOTTLENECK_RESNETS))
        raise UserError(f"config field model.backbone: unknown backbone '{name}' (known: {known})")
    weights = "DEFAULT" if pretrained else None
    builder = getattr(torchvision.models, name)
    try:
        if name in BOTTLENECK_RESNETS:
            net = builder(weights=weights, replace_stride_with_dilation=[False, True, True])
        else:
            net = builder(weights=weights)
            for layer in (net.layer3, net.layer4):
                layer[0].conv1.stride = (1, 1)
                layer[0].downsample[0].stride = (1, 1)
    except (OSError, RuntimeError) as exc:  # no network / no cached weights
        raise UserError(
            f"config field model.pretrained: ImageNet weights for {name} unavailable ({exc})"
        ) from None
    encoder = nn.Sequential(
        net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3, net.layer4
    )
    return encoder, net.fc.in_features


class DenseHead(nn.Module):
    """conv3x3-BN-ReLU decoder feature map, then a 1x1 prediction layer."""

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


class DenseMTLModel(MultiTaskModel):
    """Shared ResNet encoder + seg/depth/normal heads; representation = GAP of the encoder map."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.encoder, channels = resnet_encoder(config.backbone, config.pretrained)
        self.heads = nn.ModuleDict(
            {
                task: DenseHead(channels, config.head_channels, out)
                for task, out in TASK_CHANNELS.items()
            }
        )

    def forward(self, batch: Batch) -> ModelOutput:
        image = batch["input"]
        encoded = self.encoder(image)
        predictions: dict[str, Tensor] = {}
        features: dict[str, Tensor] = {}
        for task, head in self.heads.items():
            prediction, features[task] = head(encoded)
            predictions[task] = F.interpolate(
                prediction, size=image.shape[-2:], mode="bilinear", align_corners=False
            )
        predictions["normal"] = F.normalize(predictions["normal"], dim=1)
        representation = torch.flatten(F.adaptive_avg_pool2d(encoded, 1), 1)
        return ModelOutput(
            predictions=predictions, representation=representation, features=features
        )

    def shared_parameters(self) -> list[nn.Parameter]:
        return list(self.encoder.parameters())

    def last_shared_parameters(self) -> list[nn.Parameter]:
        """The last convolution of the encoder: GradNorm's W, "the last shared layer"."""
        last_conv = [m for m in self.encoder.modules() if isinstance(m, nn.Conv2d)][-1]
        return list(last_conv.parameters())
