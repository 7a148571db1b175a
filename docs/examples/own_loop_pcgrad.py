"""ReLiF with a gradient method in your own PyTorch loop: PCGrad and PCGrad + ReLiF.

    python docs/examples/own_loop_pcgrad.py

The data, audit scores, controller settings and protocol of docs/examples/own_loop.py (imported
from it); only the backward pass differs. It is handed to PCGrad (`relif_ray.methods`, Yu et al.
2020), which projects conflicting task gradients on the shared trunk, then adds the ReLiF term's
gradient unchanged (never projected) and fills `.grad` (docs/methods.md). PCGrad's per-task
weights c (sum_k c_k g_k is the shared update) are returned; `projected` counts the steps on
which it removed a conflicting component. The plain PCGrad loop is the reference of delta_ref.
"""

import torch
from own_loop import BATCH, STEPS, TASKS, audit_scores, features, labels, report, train, val
from torch import nn

from relif_ray.methods import StepContext, build_method
from relif_ray.relif import ReLiFConfig, ReLiFRegularizer, scale_to_budget


def train_pcgrad(config: ReLiFConfig) -> tuple[dict, torch.Tensor, dict]:
    torch.manual_seed(0)  # the same initial weights and batches with and without ReLiF
    trunk = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
    heads = nn.ModuleDict({"mortality": nn.Linear(32, 1), "stay": nn.Linear(32, 4)})
    relif = ReLiFRegularizer(config, TASKS)
    pcgrad = build_method("pcgrad", TASKS, seed=0)  # its random projection order is seeded
    optimizer = torch.optim.Adam([*trunk.parameters(), *heads.parameters()], lr=1e-2)
    projected = 0
    for step in range(STEPS):
        batch = train[torch.randint(0, len(train), (BATCH,))]
        representation = trunk(features[batch])
        logits = {task: head(representation) for task, head in heads.items()}
        task_losses = {
            "mortality": nn.functional.binary_cross_entropy_with_logits(
                logits["mortality"][:, 0], labels["mortality"][batch]
            ),
            "stay": nn.functional.cross_entropy(logits["stay"], labels["stay"][batch]),
        }
        valid = torch.ones(BATCH, dtype=torch.bool)
        scores = {task: (score, valid) for task, score in audit_scores(logits).items()}
        loss_lip, stats = relif(scores, representation)  # None for lipschitz_branch=False
        shared = list(trunk.parameters())
        context = StepContext(shared, last_shared_parameters=shared[-2:], step=step)
        optimizer.zero_grad()
        weights = pcgrad.backward(task_losses, context, extra_loss=loss_lip)  # fills .grad
        projected += int(any(float(weight) != 1.0 for weight in weights.values()))
        optimizer.step()
    print(f"projected={projected}")
    with torch.no_grad():
        representation = trunk(features[val])
        return stats, representation, {task: head(representation) for task, head in heads.items()}


if __name__ == "__main__":
    eta, warmup = scale_to_budget(STEPS)
    plain = train_pcgrad(ReLiFConfig(lipschitz_branch=False))
    relif = train_pcgrad(ReLiFConfig(r_star=0.16, eta=eta, warmup_steps=warmup))
    report({"pcgrad": plain, "pcgrad+relif": relif})
