"""ReLiF with a gradient method in your own PyTorch loop: PCGrad + ReLiF on a two-head MLP.

    python docs/examples/own_loop_pcgrad.py

The loop of docs/examples/own_loop.py, with the backward pass handed to PCGrad
(`relif_ray.methods`, Yu et al. 2020): it projects the conflicting task gradients on the shared
trunk, then adds the ReLiF term's gradient unchanged (never projected), and fills `.grad`
(docs/methods.md). PCGrad's per-task weights c (sum_k c_k g_k is the shared update) are returned.
"""

import torch
from torch import nn

from relif_ray.audit import fixed_delta_audit, scores_frame
from relif_ray.methods import StepContext, build_method
from relif_ray.relif import ReLiFConfig, ReLiFRegularizer, scale_to_budget

TASKS, STEPS, BATCH = ["smoker", "diabetic"], 150, 64
torch.manual_seed(0)
inputs = torch.randn(1024, 12)  # 1,024 examples x 12 features; the two tasks partly conflict
labels = {"smoker": inputs[:, 0] + inputs[:, 1] > 0, "diabetic": inputs[:, 1] - inputs[:, 0] > 0}
train, test = torch.arange(768), torch.arange(768, 1024)
trunk = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())  # shared
heads = nn.ModuleDict({task: nn.Linear(32, 1) for task in TASKS})

eta, warmup = scale_to_budget(STEPS)  # the paper's eta x steps and warmup share (own_loop.py)
relif = ReLiFRegularizer(ReLiFConfig(r_star=0.2, eta=eta, warmup_steps=warmup), TASKS)
pcgrad = build_method("pcgrad", TASKS, seed=0)  # its random projection order is seeded
optimizer = torch.optim.Adam([*trunk.parameters(), *heads.parameters()], lr=1e-2)
projected = 0  # steps on which PCGrad removed a conflicting component
for step in range(STEPS):
    batch = train[torch.randint(0, len(train), (BATCH,))]
    representation = trunk(inputs[batch])  # (BATCH, 32): the shared representation
    logits = {task: head(representation)[:, 0] for task, head in heads.items()}  # (BATCH,)
    task_losses = {
        t: nn.functional.binary_cross_entropy_with_logits(logits[t], labels[t][batch].float())
        for t in TASKS
    }
    valid = torch.ones(BATCH, dtype=torch.bool)
    scores = {t: (torch.sigmoid(logits[t]), valid) for t in TASKS}  # p_k(x) in [0, 1]
    loss_lip, stats = relif(scores, representation)  # None for lipschitz_branch=False
    shared = list(trunk.parameters())
    context = StepContext(shared, last_shared_parameters=shared[-2:], step=step)
    optimizer.zero_grad()
    weights = pcgrad.backward(task_losses, context, extra_loss=loss_lip)  # fills .grad
    projected += int(any(float(w) != 1.0 for w in weights.values()))
    optimizer.step()
print(" ".join(f"{key}={float(stats[key]):.6f}" for key in ("lambda", "r_ema", "loss_lip")))
print(f"projected={projected}")

with torch.no_grad():
    logits = {task: head(trunk(inputs[test]))[:, 0] for task, head in heads.items()}
accuracy = {t: float(((logits[t] > 0) == labels[t][test]).float().mean()) for t in TASKS}
audit = fixed_delta_audit(scores_frame({t: torch.sigmoid(logits[t]).numpy() for t in TASKS}), 0.1)
print(f"accuracy {accuracy}")
print(f"audit delta=0.1 bias={audit.bias:.6f} vr={audit.vr:.6f}")
