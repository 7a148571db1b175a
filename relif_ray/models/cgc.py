"""CGC: Customized Gate Control (Tang et al., RecSys 2020, the one-level PLE), as LibMTL
1.1.5's `CGC`.

`num_experts` experts shared by every task and `task_experts` experts of each task's own,
each a whole encoder; each task's gate weighs the shared experts and its own (in that order)
per example (per time step on the LSTM), and the task's head reads that mixture
(`relif_ray.models.experts`). Shared parameters: the shared experts (LibMTL's); each task's
experts and gate are its own. LibMTL takes one number of experts per task; here every task
has `task_experts`.
"""

from __future__ import annotations

from torch import Tensor, nn

from relif_ray.models.base import TaskInputs, TaskTrunk
from relif_ray.models.clinical import Stays
from relif_ray.models.experts import ExpertFamily, Gate, mix


class CGC(TaskTrunk):
    name = "cgc"

    def __init__(
        self, family: ExpertFamily, tasks: list[str], num_experts: int, task_experts: int
    ) -> None:
        super().__init__()
        self.family = family
        self.shared = nn.ModuleList(family.encoder() for _ in range(num_experts))
        self.specific = nn.ModuleDict(
            {task: nn.ModuleList(family.encoder() for _ in range(task_experts)) for task in tasks}
        )
        self.gates = nn.ModuleDict(
            {task: Gate(family.gate_size, num_experts + task_experts) for task in tasks}
        )

    def forward(self, inputs: Tensor, stays: Stays | None = None) -> TaskInputs:
        shared = [self.family.run(expert, inputs, stays) for expert in self.shared]
        features = self.family.gate_input(inputs)
        per_task = {}
        for task, gate in self.gates.items():
            own = [self.family.run(expert, inputs, stays) for expert in self.specific[task]]
            per_task[task] = mix(shared + own, gate(features))
        return TaskInputs(per_task)

    def shared_parameters(self) -> list[nn.Parameter]:
        return list(self.shared.parameters())

    def last_shared_parameters(self) -> list[nn.Parameter]:
        return [p for expert in self.shared for p in self.family.last_layer(expert)]
