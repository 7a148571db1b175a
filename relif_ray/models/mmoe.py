"""MMoE: Multi-gate Mixture-of-Experts (Ma et al., KDD 2018), as LibMTL 1.1.5's `MMoE`.

`num_experts` experts, each a whole encoder, are shared by every task; each task's gate
weighs them per example (per time step on the LSTM) from the input it reads, and the task's
head reads that mixture (`relif_ray.models.experts`). Shared parameters: the experts (LibMTL's
`get_share_params`); each task's gate is its own.
"""

from __future__ import annotations

from torch import Tensor, nn

from relif_ray.models.base import TaskInputs, TaskTrunk
from relif_ray.models.clinical import Stays
from relif_ray.models.experts import ExpertFamily, Gate, mix


class MMoE(TaskTrunk):
    name = "mmoe"

    def __init__(self, family: ExpertFamily, tasks: list[str], num_experts: int) -> None:
        super().__init__()
        self.family = family
        self.experts = nn.ModuleList(family.encoder() for _ in range(num_experts))
        self.gates = nn.ModuleDict({task: Gate(family.gate_size, num_experts) for task in tasks})

    def forward(self, inputs: Tensor, stays: Stays | None = None) -> TaskInputs:
        outputs = [self.family.run(expert, inputs, stays) for expert in self.experts]
        features = self.family.gate_input(inputs)
        return TaskInputs({task: mix(outputs, gate(features)) for task, gate in self.gates.items()})

    def shared_parameters(self) -> list[nn.Parameter]:
        return list(self.experts.parameters())

    def last_shared_parameters(self) -> list[nn.Parameter]:
        return [p for expert in self.experts for p in self.family.last_layer(expert)]
