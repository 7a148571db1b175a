"""Cross-stitch networks (Misra et al., CVPR 2016) on the ResNet, after LibMTL 1.1.5's
`Cross_stitch`.

One ResNet per task (its column). After layer1, layer2 and layer3 a cross-stitch unit mixes
the columns: the input of task t's next layer is sum_j alpha_tj x_j, x_j the output of column
j's layer. The units are the paper's: one row alpha_t per task and level, a K x K matrix per
level. LibMTL's `cross_unit` has one row per level (4 x K, the fourth row unused) that every
task shares, so all columns read the same mixture; its forward is ours with every task's row
set to LibMTL's (tested with copied weights). Both start from all ones (LibMTL's
initialisation), where the two agree; ours then lets each task learn its own mixture, which
is what a cross-stitch unit is (docs/architectures.md). The task's head reads its column's
layer4 output.

Shared parameters: every column's stem and layer1..3 and the first two units (every task's
loss reaches them through the units), not each column's layer4 nor the last unit's rows,
which only their own task reads. LibMTL's `get_share_params` returns the whole encoder, so
its gradient methods also combine gradients on parameters that a single task reaches.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from relif_ray.models.base import TaskInputs, TaskTrunk
from relif_ray.models.clinical import Stays
from relif_ray.models.dense import last_convolution, resnet_stages
from relif_ray.models.experts import ResNetExperts

STITCHED_LAYERS = 3
"""Units after layer1, layer2 and layer3."""


class CrossStitch(TaskTrunk):
    name = "cross_stitch"

    def __init__(self, family: ResNetExperts, tasks: list[str]) -> None:
        super().__init__()
        columns = {task: resnet_stages(family.encoder()) for task in tasks}
        self.stages = nn.ModuleList(
            nn.ModuleDict({task: columns[task][stage] for task in tasks}) for stage in range(5)
        )
        """stages[s][task]: stage s (stem, layer1, ..., layer4) of the task's column."""
        self.units = nn.ModuleList(
            nn.ParameterDict({task: nn.Parameter(torch.ones(len(tasks))) for task in tasks})
            for _ in range(STITCHED_LAYERS)
        )
        """units[l][task]: the weights alpha_t of the columns in task t's input after layer
        l + 1 (in task order)."""

    def forward(self, inputs: Tensor, stays: Stays | None = None) -> TaskInputs:
        outputs = {task: stem(inputs) for task, stem in self.stages[0].items()}
        outputs = {task: layer(outputs[task]) for task, layer in self.stages[1].items()}
        for unit, stage in zip(self.units, self.stages[2:], strict=True):
            columns = list(outputs.values())
            outputs = {
                task: layer(sum(alpha * x for alpha, x in zip(unit[task], columns, strict=True)))
                for task, layer in stage.items()
            }
        return TaskInputs(outputs)

    def shared_parameters(self) -> list[nn.Parameter]:
        modules = [*self.stages[:4], *self.units[:-1]]
        return [p for module in modules for p in module.parameters()]

    def last_shared_parameters(self) -> list[nn.Parameter]:
        """The last convolution of every column's layer3 (the last unit reads them)."""
        return [p for layer in self.stages[3].values() for p in last_convolution(layer)]
