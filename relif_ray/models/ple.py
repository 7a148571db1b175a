"""PLE: Progressive Layered Extraction (Tang et al., RecSys 2020), as LibMTL 1.1.5's `PLE`.

The encoder is cut into levels (`ExpertFamily.stages`: the ResNet's stem and four layers, as
LibMTL's; the LSTM's layers). At every level each task has its own input (the image at the
first level, then its mixture of the level before); `num_experts` shared experts and the
task's `task_experts` own experts of that level read it, and the task's gate of that level
weighs them (shared first) from the same input. The task's head reads its last mixture.

As in LibMTL's, the shared experts of a level read each task's input separately (the paper
also has a shared gate whose mixture the shared experts of the next level read; LibMTL has
none, and neither have we). Shared parameters: the shared experts of every level (LibMTL's
`get_share_params`); each task's experts and gates are its own. On the LSTM, `model.dropout`
acts on each level's input but the first.
"""

from __future__ import annotations

from torch import Tensor, nn

from relif_ray.models.base import TaskInputs, TaskTrunk
from relif_ray.models.clinical import Stays
from relif_ray.models.experts import ExpertFamily, Gate, mix


class PLE(TaskTrunk):
    name = "ple"

    def __init__(
        self, family: ExpertFamily, tasks: list[str], num_experts: int, task_experts: int
    ) -> None:
        super().__init__()
        self.family = family
        self.shared = nn.ModuleList(nn.ModuleList(family.stages()) for _ in range(num_experts))
        """shared[k][level]: level `level` of shared expert k."""
        self.specific = nn.ModuleDict(
            {
                task: nn.ModuleList(nn.ModuleList(family.stages()) for _ in range(task_experts))
                for task in tasks
            }
        )
        experts = num_experts + task_experts
        self.gates = nn.ModuleDict(
            {
                task: nn.ModuleList(Gate(size, experts) for size in family.level_inputs)
                for task in tasks
            }
        )
        self.between_levels = family.level_dropout()

    def forward(self, inputs: Tensor, stays: Stays | None = None) -> TaskInputs:
        mixtures = dict.fromkeys(self.gates, inputs)
        for level in range(len(self.family.level_inputs)):
            for task, gates in self.gates.items():
                level_input = mixtures[task] if level == 0 else self.between_levels(mixtures[task])
                experts = [*self.shared, *self.specific[task]]
                outputs = [self.family.run(e[level], level_input, stays) for e in experts]
                weights = gates[level](self.family.gate_input(level_input))
                mixtures[task] = mix(outputs, weights)
        return TaskInputs(mixtures)

    def shared_parameters(self) -> list[nn.Parameter]:
        return list(self.shared.parameters())

    def last_shared_parameters(self) -> list[nn.Parameter]:
        return [p for expert in self.shared for p in self.family.last_layer(expert[-1])]
