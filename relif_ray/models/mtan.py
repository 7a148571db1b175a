"""MTAN: Multi-Task Attention Network (Liu et al., CVPR 2019) on the ResNet, as LibMTL 1.1.5's
`MTAN` (its `_transform_resnet_MTAN`, after the authors' code).

One shared ResNet (the global network) and, per task, soft-attention modules at each of its
four layers. At layer i the shared network gives u_i, the output of the layer's blocks but the
last, and p_i, that of the last block. Task t's attention mask is
a_ti = sigmoid-BN(conv1x1-BN-ReLU-conv1x1(u_0)) at the first layer and of the concatenation
[u_i, f_t(i-1)] at the others (f resized by a 2x2 max-pool where the sizes differ); the task's
features are a_ti * p_i, passed through a residual block shared by the tasks (to the next
layer's width) below the last layer, and max-pooled after the first. The task's head reads its
features after the last layer.

Shared parameters: the global network AND the residual blocks of the attention path
(`block_attention`): every task's features pass through them. LibMTL's `get_share_params`
leaves those blocks out, so its gradient methods sum the tasks' gradients there instead of
combining them; here they are combined as on every other parameter several tasks reach
(docs/architectures.md). The forward is LibMTL's (tested with copied weights).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from relif_ray.models.base import TaskInputs, TaskTrunk
from relif_ray.models.clinical import Stays
from relif_ray.models.dense import last_convolution, resnet_stages
from relif_ray.models.experts import ResNetExperts

LEVELS = 4
"""The ResNet's four layers."""


def attention_layer(in_channels: int, middle: int, out_channels: int) -> nn.Sequential:
    """conv1x1-BN-ReLU-conv1x1-BN-sigmoid: one task's attention mask at one layer."""
    return nn.Sequential(
        nn.Conv2d(in_channels, middle, kernel_size=1),
        nn.BatchNorm2d(middle),
        nn.ReLU(inplace=True),
        nn.Conv2d(middle, out_channels, kernel_size=1),
        nn.BatchNorm2d(out_channels),
        nn.Sigmoid(),
    )


def residual_block(block: type[nn.Module], in_channels: int, planes: int) -> nn.Module:
    """The backbone's own residual block class (torchvision's BasicBlock or Bottleneck) from
    `in_channels` to its output width for `planes`, with a conv1x1-BN projection shortcut."""
    out_channels = planes * block.expansion
    shortcut = nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=1, bias=False),
        nn.BatchNorm2d(out_channels),
    )
    return block(in_channels, planes, downsample=shortcut)


class MTAN(TaskTrunk):
    name = "mtan"

    def __init__(self, family: ResNetExperts, tasks: list[str]) -> None:
        super().__init__()
        stages = resnet_stages(family.encoder())
        block = type(stages[1][-1])
        expansion, widths = block.expansion, family.widths
        self.stem = stages[0]
        self.shared_layers = nn.ModuleList(
            nn.ModuleList([layer[:-1], layer[-1]]) for layer in stages[1:]
        )
        """Each layer as (its blocks but the last, its last block)."""
        self.attention = nn.ModuleList()
        for level, width in enumerate(widths):
            reads = width if level == 0 else 2 * width
            self.attention.append(
                nn.ModuleDict(
                    {task: attention_layer(reads, width // expansion, width) for task in tasks}
                )
            )
        self.block_attention = nn.ModuleList(
            residual_block(block, widths[level], widths[level + 1] // expansion)
            for level in range(LEVELS - 1)
        )
        self.downsample = nn.MaxPool2d(kernel_size=2, stride=2)

    def forward(self, inputs: Tensor, stays: Stays | None = None) -> TaskInputs:
        shared = self.stem(inputs)
        features: dict[str, Tensor] = {}
        for level, (body, last_block) in enumerate(self.shared_layers):
            inner = body(shared)
            shared = last_block(inner)
            for task, attention in self.attention[level].items():
                if level == 0:
                    mask = attention(inner)
                else:
                    previous = features[task]
                    if previous.shape[-2:] != inner.shape[-2:]:
                        previous = self.downsample(previous)
                    mask = attention(torch.cat([inner, previous], dim=1))
                attended = mask * shared
                if level < LEVELS - 1:
                    attended = self.block_attention[level](attended)
                features[task] = self.downsample(attended) if level == 0 else attended
        return TaskInputs(features)

    def shared_parameters(self) -> list[nn.Parameter]:
        modules = [self.stem, self.shared_layers, self.block_attention]
        return [p for module in modules for p in module.parameters()]

    def last_shared_parameters(self) -> list[nn.Parameter]:
        """The global network's last convolution."""
        return last_convolution(self.shared_layers)
