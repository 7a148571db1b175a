"""ReLiF in your own PyTorch loop: a two-head MLP trained with the regularizer, then audited.

    python docs/examples/own_loop.py

Two binary tasks share an MLP trunk; each task's audit score p_k(x) is its sigmoid
probability, and the trunk's output is the shared representation (paper section 3).
"""

import torch
from torch import nn

from relif_ray.audit import fixed_delta_audit, scores_frame
from relif_ray.relif import ReLiFConfig, ReLiFRegularizer

TASKS = ["smoker", "diabetic"]
torch.manual_seed(0)
inputs = torch.randn(1024, 12)
labels = {"smoker": inputs[:, 0] + inputs[:, 1] > 0, "diabetic": inputs[:, 0] - inputs[:, 2] > 0}
train, test = torch.arange(768), torch.arange(768, 1024)


class TwoHeadMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.heads = nn.ModuleDict({task: nn.Linear(32, 1) for task in TASKS})

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        shared = self.trunk(x)  # the shared representation
        return shared, {task: head(shared)[:, 0] for task, head in self.heads.items()}


model = TwoHeadMLP()
relif = ReLiFRegularizer(ReLiFConfig(r_star=0.2, eta=0.05, warmup_steps=20), TASKS)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for _ in range(150):
    batch = train[torch.randint(0, len(train), (64,))]
    representation, logits = model(inputs[batch])
    task_loss = sum(
        nn.functional.binary_cross_entropy_with_logits(logits[t], labels[t][batch].float())
        for t in TASKS
    )
    valid = torch.ones(len(batch), dtype=torch.bool)
    scores = {task: (torch.sigmoid(logits[task]), valid) for task in TASKS}
    loss_lip, stats = relif(scores, representation)  # lambda_t * L_lip and the controller state
    optimizer.zero_grad()
    (task_loss + loss_lip).backward()
    optimizer.step()
print(" ".join(f"{key}={float(stats[key]):.6f}" for key in ("lambda", "r_ema", "loss_lip")))

with torch.no_grad():
    _, logits = model(inputs[test])
accuracy = {t: float(((logits[t] > 0) == labels[t][test]).float().mean()) for t in TASKS}
frame = scores_frame({task: torch.sigmoid(logits[task]).numpy() for task in TASKS})
audit = fixed_delta_audit(frame, delta=0.1)  # Algorithm 1: N_eval 256, S 4096 pairs
print(f"accuracy {accuracy}")
print(f"audit delta=0.1 bias={audit.bias:.6f} vr={audit.vr:.6f}")
