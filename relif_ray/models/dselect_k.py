"""DSelect-k: differentiable selection of k experts (Hazimeh et al., NeurIPS 2021), as LibMTL
1.1.5's `DSelect_k`.

`num_experts` shared experts (whole encoders, as MMoE's). Each task's gate selects
`num_nonzeros` (k) of them with k single-expert selectors: selector i has m = ceil(log2 E)
logits z_i, smoothed by the smooth step S(t) = 0 below -gamma/2, 1 above gamma/2, else
-2 t^3 / gamma^3 + 3 t / (2 gamma) + 1/2; expert e's weight in selector i is the product over
the m bits b of e's binary code (most significant first) of S(z_ib) where b is 1, else
1 - S(z_ib). A softmax over k further logits w weighs the selectors: the task's weight of
expert e is sum_i softmax(w)_i * selector_i(e), and its head reads the experts' mixture with
those weights. z and w are linear in the gate's input (the flattened image; each time step's
input on the LSTM), initialised uniform in [-gamma/100, gamma/100] and [-0.05, 0.05] (LibMTL's,
the authors' TensorFlow code's).

Regularizer (`TaskInputs.auxiliary_loss`, training only): for every task's selectors s,
`entropy_reg` * -sum s log(s + 1e-6) (pushes each selector to one expert), plus, when E is not
a power of two, sum 1 / sum_e s(e) (keeps a selector off the codes of experts that do not
exist), summed over the batch (over each stay's valid steps on the LSTM). The engine adds it
to the step's loss after the method's aggregation.

Where we differ from LibMTL 1.1.5 on purpose (docs/architectures.md):
- its smooth step always uses gamma = 1 (`_smooth_step_fun` is called without `kgamma`, which
  only scales the initialisation); ours uses `gamma`, as the paper and the authors' code do.
  Equal at the default gamma = 1.
- it regularizes the LAST task's selectors only (the loop variable left after its task loop)
  and calls `backward()` on that term inside `forward`; ours regularizes every task's gate, as
  the authors' code (each task's gate adds its own loss), through the step's loss.
Shared parameters: the experts (LibMTL's); each task's z and w are its own.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from relif_ray.models.base import TaskInputs, TaskTrunk
from relif_ray.models.clinical import Stays
from relif_ray.models.experts import ExpertFamily, mix

LOG_EPS = 1e-6
"""Inside the entropy's log (LibMTL's and the authors')."""


def smooth_step(logits: Tensor, gamma: float) -> Tensor:
    """The cubic smooth step of the module docstring, 0 below -gamma/2 and 1 above gamma/2."""
    cubic = -2 / gamma**3 * logits**3 + 3 / (2 * gamma) * logits + 0.5
    return torch.where(
        logits <= -gamma / 2,
        torch.zeros_like(logits),
        torch.where(logits >= gamma / 2, torch.ones_like(logits), cubic),
    )


def binary_codes(num_experts: int) -> Tensor:
    """(E, m) bool: expert e's binary code, most significant bit first."""
    bits = math.ceil(math.log2(num_experts))
    exponents = torch.arange(bits - 1, -1, -1)
    return (torch.arange(num_experts)[:, None] >> exponents) % 2 == 1


class DSelectK(TaskTrunk):
    name = "dselect_k"

    def __init__(
        self,
        family: ExpertFamily,
        tasks: list[str],
        num_experts: int,
        num_nonzeros: int,
        gamma: float,
        entropy_reg: float,
    ) -> None:
        super().__init__()
        self.family = family
        self.num_nonzeros, self.gamma, self.entropy_reg = num_nonzeros, gamma, entropy_reg
        self.experts = nn.ModuleList(family.encoder() for _ in range(num_experts))
        self.register_buffer("codes", binary_codes(num_experts), persistent=False)
        bits = self.codes.shape[1]
        self.power_of_two = num_experts == 2**bits
        self.selector_logits = nn.ModuleDict(
            {task: nn.Linear(family.gate_size, num_nonzeros * bits) for task in tasks}
        )
        self.weight_logits = nn.ModuleDict(
            {task: nn.Linear(family.gate_size, num_nonzeros) for task in tasks}
        )
        with torch.no_grad():
            for param in self.selector_logits.parameters():
                param.uniform_(-gamma / 100, gamma / 100)
            for param in self.weight_logits.parameters():
                param.uniform_(-0.05, 0.05)

    def selectors(self, task: str, features: Tensor) -> Tensor:
        """(..., k, E): each of the task's k single-expert selectors' weights over the experts."""
        logits = self.selector_logits[task](features)
        logits = logits.unflatten(-1, (self.num_nonzeros, 1, self.codes.shape[1]))
        step = smooth_step(logits, self.gamma)
        return torch.where(self.codes, step, 1 - step).prod(-1)

    def forward(self, inputs: Tensor, stays: Stays | None = None) -> TaskInputs:
        outputs = [self.family.run(expert, inputs, stays) for expert in self.experts]
        features = self.family.gate_input(inputs)
        per_task, penalties = {}, []
        for task in self.selector_logits:
            selectors = self.selectors(task, features)
            weights = self.weight_logits[task](features).softmax(dim=-1)
            expert_weights = (weights.unsqueeze(-1) * selectors).sum(-2)
            per_task[task] = mix(outputs, expert_weights)
            if self.training:
                penalties.append(self.regularizer(selectors, stays))
        return TaskInputs(per_task, torch.stack(penalties).sum() if penalties else None)

    def regularizer(self, selectors: Tensor, stays: Stays | None) -> Tensor:
        """One task's term of the module docstring's regularizer, (..., k, E) selectors."""
        entropy = -(selectors * torch.log(selectors + LOG_EPS)).sum(dim=(-2, -1))
        penalty = self.entropy_reg * entropy
        if not self.power_of_two:
            penalty = penalty + (1 / selectors.sum(-1)).sum(-1)
        if stays is not None:
            penalty = penalty * stays.valid()
        return penalty.sum()

    def shared_parameters(self) -> list[nn.Parameter]:
        return list(self.experts.parameters())

    def last_shared_parameters(self) -> list[nn.Parameter]:
        return [p for expert in self.experts for p in self.family.last_layer(expert)]
