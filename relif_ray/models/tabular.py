"""The tabular model: an MLP trunk shared by every task, and one linear head per task.

Hard parameter sharing only (`model.architecture: hps`). The trunk is `model.num_layers`
blocks of Linear(`model.hidden_size`) - ReLU - Dropout(`model.dropout`); the representation
(ReLiF's prototypes, the audit's method-induced thresholds) and the one encoder output every
head reads is the trunk's output. A head with one output predicts (B,), with more (B, C).
"""

from __future__ import annotations

from torch import nn

from relif_ray.config import ModelConfig
from relif_ray.data.splits import Batch
from relif_ray.errors import UserError
from relif_ray.models.base import MultiTaskModel
from relif_ray.tasks.base import ModelOutput


class TabularMTLModel(MultiTaskModel):
    """MLP trunk + one linear head per task; forward(batch) reads batch["input"] (B, F).

    heads: task -> number of outputs (1 for a binary or a regression task)."""

    def __init__(self, config: ModelConfig, input_size: int, heads: dict[str, int]) -> None:
        if config.pretrained != "none":
            raise UserError(
                f"config field model.pretrained: the tabular MLP has no pretrained weights "
                f"(got {config.pretrained!r}; use none)"
            )
        if config.head != "simple":
            raise UserError(
                f"config field model.head: {config.head} applies to NYUv2's dense heads only "
                "(the tabular heads are linear; use simple)"
            )
        super().__init__()
        layers: list[nn.Module] = []
        width = input_size
        for _ in range(config.num_layers):
            layers += [nn.Linear(width, config.hidden_size), nn.ReLU(), nn.Dropout(config.dropout)]
            width = config.hidden_size
        self.trunk = nn.Sequential(*layers)
        self.heads = nn.ModuleDict({task: nn.Linear(width, n) for task, n in heads.items()})

    def forward(self, batch: Batch) -> ModelOutput:
        encoded = self.trunk(batch["input"])
        predictions = {}
        for task, head in self.heads.items():
            output = head(encoded)
            predictions[task] = output[:, 0] if output.shape[1] == 1 else output
        return ModelOutput(predictions=predictions, representation=encoded, encoder_output=encoded)

    def shared_parameters(self) -> list[nn.Parameter]:
        return list(self.trunk.parameters())

    def last_shared_parameters(self) -> list[nn.Parameter]:
        last = [module for module in self.trunk if isinstance(module, nn.Linear)][-1]
        return list(last.parameters())


def build_tabular_model(
    config: ModelConfig, input_size: int, heads: dict[str, int]
) -> MultiTaskModel:
    """The tabular model of `config` (hard sharing; another architecture is refused by
    `relif_ray.problems.checked_model`)."""
    if config.num_layers < 1:
        raise UserError("config field model.num_layers: the tabular MLP needs at least one layer")
    return TabularMTLModel(config, input_size, heads)
