"""ReLiF in your own PyTorch loop, audited against the same loop without it.

    python docs/examples/own_loop.py

Two clinical tasks, the paper's eICU pair, share an MLP trunk: in-hospital mortality (audit
score p(x): its sigmoid probability) and the length of stay in 4 bins (audit score: its max
softmax). Both scores are probabilities, so nothing is squashed; a score that is not one (NYUv2's
depth feature norm) would be squashed with the plain run's validation q10/q90, given to
`ReLiFConfig(squash_constants=...)` and to `relif_ray.squash.squash` for the audit. Outcomes
are drawn from each stay's risk, as real outcomes are, so the predicted probabilities do not
saturate at 0 or 1.

The protocol is the sweep's. The plain loop is the same code with `lipschitz_branch=False`: the
regularizer adds no loss but still measures the training violation rate r. It is the same-seed
reference: delta_ref is the 75th percentile of its validation reference distribution (the
cosine distances of its shared representations over the audit's pairs, `pair_distances`), held
fixed for both runs. r* = 0.16 is the paper's eICU target, below the plain loop's violation rate
(printed as r_ema), so the controller raises lambda above lambda0 = 0.1 and holds r near r*.
"""

import numpy as np
import torch
from torch import nn

from relif_ray.audit import fixed_delta_audit, scores_frame
from relif_ray.audit_thresholds import delta_from_quantile, pair_distances
from relif_ray.relif import ReLiFConfig, ReLiFRegularizer, scale_to_budget
from relif_ray.tasks.clinical import binary_auroc, linear_weighted_kappa

TASKS, STEPS, BATCH = ["mortality", "stay"], 150, 64
torch.manual_seed(0)
features = torch.randn(1024, 12)  # 1,024 stays x 12 features
risk = features[:, 0] + features[:, 1] / 2 - 2  # outcomes are drawn from it, not set by it
stay_logits = torch.stack([0 * risk, risk + 1, features[:, 2], -features[:, 2]], dim=1)
labels = {
    "mortality": torch.bernoulli(torch.sigmoid(risk)),  # about one stay in six ends in death
    "stay": torch.distributions.Categorical(logits=stay_logits).sample(),  # 4 length bins
}
train, val = torch.arange(768), torch.arange(768, 1024)


def audit_scores(logits: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """p_k(x) in [0, 1]: mortality's sigmoid, the length of stay's max softmax."""
    mortality, stay = torch.sigmoid(logits["mortality"][:, 0]), logits["stay"].softmax(1)
    return {"mortality": mortality, "stay": stay.amax(1)}


def train_loop(config: ReLiFConfig) -> tuple[dict, torch.Tensor, dict]:
    torch.manual_seed(0)  # the same initial weights and batches with and without ReLiF
    trunk = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())  # shared
    heads = nn.ModuleDict({"mortality": nn.Linear(32, 1), "stay": nn.Linear(32, 4)})
    relif = ReLiFRegularizer(config, TASKS)
    optimizer = torch.optim.Adam([*trunk.parameters(), *heads.parameters()], lr=1e-2)
    for _ in range(STEPS):
        batch = train[torch.randint(0, len(train), (BATCH,))]
        representation = trunk(features[batch])  # (BATCH, 32): the shared representation
        logits = {task: head(representation) for task, head in heads.items()}
        loss = nn.functional.binary_cross_entropy_with_logits(
            logits["mortality"][:, 0], labels["mortality"][batch]
        ) + nn.functional.cross_entropy(logits["stay"], labels["stay"][batch])
        valid = torch.ones(BATCH, dtype=torch.bool)  # (BATCH,): the examples with a score
        scores = {task: (score, valid) for task, score in audit_scores(logits).items()}
        loss_lip, stats = relif(scores, representation)  # lambda_t * L_lip, controller stats
        if loss_lip is not None:  # None: lipschitz_branch=False, the plain loop
            loss = loss + loss_lip
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        representation = trunk(features[val])
        return stats, representation, {task: head(representation) for task, head in heads.items()}


def audit_frame(logits: dict[str, torch.Tensor]):  # the audit's table of validation scores
    return scores_frame({task: score.numpy() for task, score in audit_scores(logits).items()})


def report(runs: dict[str, tuple[dict, torch.Tensor, dict]]) -> None:
    """The fixed-delta audit of every run at one delta_ref, read off the first (plain) run."""
    _, reference, reference_logits = next(iter(runs.values()))
    distances = pair_distances(
        audit_frame(reference_logits), np.arange(len(val)), reference.numpy()
    )
    delta = delta_from_quantile(np.concatenate(list(distances.values())), 0.75)
    print(f"delta_ref={delta:.6f} (p75 of the plain loop's validation distances)")
    for name, (stats, _, logits) in runs.items():
        audit = fixed_delta_audit(audit_frame(logits), delta)  # Algorithm 1: 256, 4,096 pairs
        mortality, stay = labels["mortality"][val].numpy(), labels["stay"][val].numpy()
        auroc = binary_auroc(logits["mortality"][:, 0].numpy(), mortality)
        kappa = linear_weighted_kappa(stay, logits["stay"].argmax(1).numpy())
        print(
            f"{name}: lambda={float(stats['lambda']):.6f} r_ema={float(stats['r_ema']):.6f} "
            f"mortality_auroc={auroc:.4f} stay_kappa={kappa:.4f} "
            f"bias={audit.bias:.6f} vr={audit.vr:.6f}"
        )


if __name__ == "__main__":
    eta, warmup = scale_to_budget(STEPS)  # the paper's eta 1e-3 over 19,800 steps, for 150
    plain = train_loop(ReLiFConfig(lipschitz_branch=False))
    relif = train_loop(ReLiFConfig(r_star=0.16, eta=eta, warmup_steps=warmup))
    report({"plain": plain, "relif": relif})
