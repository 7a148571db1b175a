"""ReLiF in your own PyTorch loop: a two-head MLP trained with the regularizer, then audited.

    python docs/examples/own_loop.py

Two binary tasks share an MLP trunk; each task's audit score p_k(x) is its sigmoid
probability, and the trunk's output is the shared representation (paper section 3). The
README's "ReLiF in your own loop" shows the code below this docstring; a test keeps the two equal.
"""

import torch
from torch import nn

from relif_ray.audit import fixed_delta_audit, scores_frame
from relif_ray.relif import ReLiFConfig, ReLiFRegularizer, scale_to_budget

TASKS, STEPS, BATCH = ["smoker", "diabetic"], 150, 64
torch.manual_seed(0)
inputs = torch.randn(1024, 12)  # 1,024 examples x 12 features, two binary labels each
labels = {"smoker": inputs[:, 0] + inputs[:, 1] > 0, "diabetic": inputs[:, 0] - inputs[:, 2] > 0}
train, test = torch.arange(768), torch.arange(768, 1024)
trunk = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())  # shared
heads = nn.ModuleDict({task: nn.Linear(32, 1) for task in TASKS})  # one logit per task

# The paper's eta 1e-3 and 100-step warmup belong to its 19,800-step NYUv2 run; scale_to_budget
# keeps eta x steps and warmup / steps for a run of STEPS steps (here eta 0.132, warmup 1).
eta, warmup = scale_to_budget(STEPS)
relif = ReLiFRegularizer(ReLiFConfig(r_star=0.2, eta=eta, warmup_steps=warmup), TASKS)
optimizer = torch.optim.Adam([*trunk.parameters(), *heads.parameters()], lr=1e-2)
for _ in range(STEPS):
    batch = train[torch.randint(0, len(train), (BATCH,))]
    representation = trunk(inputs[batch])  # (BATCH, 32): the shared representation
    logits = {task: head(representation)[:, 0] for task, head in heads.items()}  # (BATCH,)
    task_loss = sum(
        nn.functional.binary_cross_entropy_with_logits(logits[t], labels[t][batch].float())
        for t in TASKS
    )
    valid = torch.ones(BATCH, dtype=torch.bool)  # (BATCH,): the examples that have a score
    scores = {t: (torch.sigmoid(logits[t]), valid) for t in TASKS}  # p_k(x) in [0, 1], (BATCH,)
    loss_lip, stats = relif(scores, representation)  # lambda_t * L_lip and controller stats
    loss = task_loss if loss_lip is None else task_loss + loss_lip  # None: lipschitz_branch=False
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(" ".join(f"{key}={float(stats[key]):.6f}" for key in ("lambda", "r_ema", "loss_lip")))

with torch.no_grad():
    logits = {task: head(trunk(inputs[test]))[:, 0] for task, head in heads.items()}
accuracy = {t: float(((logits[t] > 0) == labels[t][test]).float().mean()) for t in TASKS}
frame = scores_frame({t: torch.sigmoid(logits[t]).numpy() for t in TASKS})
audit = fixed_delta_audit(frame, delta=0.1)  # Algorithm 1: pools of 256, 4,096 pairs
print(f"accuracy {accuracy}")
print(f"audit delta=0.1 bias={audit.bias:.6f} vr={audit.vr:.6f}")
