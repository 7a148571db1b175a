"""Experts, gates and their mixture: what MMoE, CGC, PLE and DSelect-k are made of.

As in LibMTL, an expert is a whole copy of the encoder (`ExpertFamily.encoder`), and PLE's
levels are the encoder cut into stages (`ExpertFamily.stages`). Two families:

- `ResNetExperts` (NYUv2): an expert is the ResNet of `model.backbone` (each loads
  `model.pretrained`); a gate reads the flattened image (LibMTL's `img_size`, here the data's
  image shape), a gate of PLE's level l the flattened input of that level; PLE's five levels
  are the stem, layer1, ..., layer4 (LibMTL's).
- `LSTMExperts` (MIMIC-III, eICU): an expert is the clinical LSTM (`model.num_layers` layers,
  `model.hidden_size`, dropout between layers); PLE's levels are its layers, one LSTM layer
  per expert and level, with `model.dropout` on every level's input but the first (where
  nn.LSTM drops out between layers). LibMTL's gates read the flattened input, which has no
  fixed size for stays of varying length; here a gate reads each time step's input and mixes
  the experts' outputs at that step. With stays of one step the two are the same (tested).

A mixture is sum_e w_e * output_e with the gate's weights w (B, E) per image or (B, T, E) per
step (`mix`), LibMTL's einsum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from relif_ray.models.clinical import Stays, top_layer
from relif_ray.models.dense import (
    last_convolution,
    resnet_encoder,
    resnet_stages,
    stage_shapes,
)


class Gate(nn.Module):
    """A softmax over `experts` weights, linear in the features it reads (LibMTL's gates)."""

    def __init__(self, in_features: int, experts: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, experts)

    def forward(self, features: Tensor) -> Tensor:
        return self.linear(features).softmax(dim=-1)


def mix(outputs: Sequence[Tensor], weights: Tensor) -> Tensor:
    """sum_e weights[..., e] * outputs[e]: weights (B, E) for outputs (B, C, h, w), or (B, T, E)
    for outputs (B, T, H)."""
    stacked = torch.stack(list(outputs), dim=-1)
    trailing = (1,) * (stacked.dim() - weights.dim())
    return (stacked * weights.reshape(*weights.shape[:-1], *trailing, weights.shape[-1])).sum(-1)


class ResNetExperts:
    """ResNet experts on images of `image_shape` (C, H, W)."""

    encoder_kind = "resnet"

    def __init__(self, backbone: str, pretrained: str, image_shape: tuple[int, int, int]) -> None:
        self.backbone, self.pretrained = backbone, pretrained
        with torch.device("meta"):  # the layout only: no memory, no initialisation
            self.layout = resnet_encoder(backbone)[0]
        shapes = stage_shapes(self.layout, image_shape)
        self.level_inputs = [math.prod(shape) for shape in shapes[:-1]]
        """Features a gate of each of PLE's levels reads (the first: the image's)."""
        self.gate_size = self.level_inputs[0]
        self.out_features = shapes[-1][0]
        """Channels of an expert's output."""
        self.widths = [shape[0] for shape in shapes[2:]]
        """Channels of layer1..layer4's outputs (MTAN's attention widths)."""

    def encoder(self) -> nn.Module:
        return resnet_encoder(self.backbone, self.pretrained)[0]

    def stages(self) -> list[nn.Module]:
        """One expert's levels: a fresh encoder's stem, layer1, ..., layer4."""
        return resnet_stages(self.encoder())

    def level_dropout(self) -> nn.Module:
        return nn.Identity()

    @staticmethod
    def run(module: nn.Module, inputs: Tensor, stays: Stays | None) -> Tensor:
        return module(inputs)

    @staticmethod
    def gate_input(inputs: Tensor) -> Tensor:
        return torch.flatten(inputs, start_dim=1)

    @staticmethod
    def last_layer(module: nn.Module) -> list[nn.Parameter]:
        return last_convolution(module)


class LSTMExperts:
    """LSTM experts over stays of `input_size` features per step."""

    encoder_kind = "lstm"

    def __init__(self, input_size: int, hidden_size: int, num_layers: int, dropout: float) -> None:
        self.input_size, self.hidden_size = input_size, hidden_size
        self.num_layers, self.dropout = num_layers, dropout
        self.level_inputs = [input_size] + [hidden_size] * (num_layers - 1)
        self.gate_size = input_size
        self.out_features = hidden_size

    def encoder(self) -> nn.Module:
        return nn.LSTM(
            input_size=self.input_size,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            batch_first=True,
            dropout=self.dropout if self.num_layers > 1 else 0.0,
        )

    def stages(self) -> list[nn.Module]:
        """One expert's levels: one LSTM layer each."""
        return [
            nn.LSTM(size, self.hidden_size, num_layers=1, batch_first=True)
            for size in self.level_inputs
        ]

    def level_dropout(self) -> nn.Module:
        return nn.Dropout(self.dropout)

    @staticmethod
    def run(module: nn.Module, inputs: Tensor, stays: Stays) -> Tensor:
        return stays.run(module, inputs)[0]

    @staticmethod
    def gate_input(inputs: Tensor) -> Tensor:
        return inputs

    @staticmethod
    def last_layer(module: nn.Module) -> list[nn.Parameter]:
        return top_layer(module)


ExpertFamily = ResNetExperts | LSTMExperts
