"""The pieces of ReLiF's training surrogate (paper section 4.2-4.3, Algorithm 2).

- `huber_rho`: the Huber transform of a gap (Eq. huber-rho).
- `huberized_hinge`: the smooth hinge on the normalized margin (Eq. huber-hinge).
- `cosine_distance`: d(u, v) = (1 - cos(u, v)) / 2 on L2-normalized embeddings.
- `prototype_pairs`: the mini-batch set P_t of cross-task prototype pairs with their signed
  gaps Delta s = p_i(x) - p_j(y) and clipped distances d' = max(d, eps_d).

Everything here is a pure tensor function: no state, no host synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

Pairing = Literal["cross", "rank"]


def huber_rho(u: Tensor, beta: float) -> Tensor:
    """rho_beta(u) = u^2 / (2 beta) for |u| <= beta, |u| - beta / 2 otherwise (Eq. huber-rho).

    Even in u, continuous with a continuous derivative at |u| = beta.
    """
    magnitude = u.abs()
    return torch.where(magnitude <= beta, u.square() / (2 * beta), magnitude - beta / 2)


def huberized_hinge(z: Tensor, mu: float) -> Tensor:
    """phi_mu(z) = 0 for z <= 0, z^2 / (2 mu) on (0, mu], z - mu / 2 above (Eq. huber-hinge).

    It never exceeds the hinge (z)_+ and stays within mu / 2 of it (the paper's Theorem B.4).
    """
    positive = z.clamp_min(0.0)
    return torch.where(positive <= mu, positive.square() / (2 * mu), positive - mu / 2)


def cosine_distance(u: Tensor, v: Tensor) -> Tensor:
    """d(u, v) = (1 - cos(u, v)) / 2 in [0, 1], over the last dimension (broadcasting).

    Embeddings are L2-normalized first (a zero vector stays zero, so its cosine is 0 and its
    distance 1/2 to everything, rather than NaN).
    """
    cosine = (F.normalize(u, dim=-1) * F.normalize(v, dim=-1)).sum(-1)
    return (1 - cosine.clamp(-1.0, 1.0)) / 2


@dataclass
class PrototypePairs:
    """The pair set P_t, flattened over task pairs.

    gap: signed Delta s = p_i(x) - p_j(y), differentiable in the scores.
    distance: d' = max(d(f(x), f(y)), eps_d), differentiable in the representation.
    mask: True for pairs whose two examples are valid and finite. Masked-out entries hold
        finite placeholder values (zero inputs), so gradients through them are exactly zero;
        every statistic over P_t must use `mask`.
    index, selected_ok: (T, k) batch indices of each task's prototypes and whether each is
        usable (`select_prototypes`).
    """

    gap: Tensor
    distance: Tensor
    mask: Tensor
    index: Tensor
    selected_ok: Tensor


def task_pairs(num_tasks: int, device: torch.device | None = None) -> tuple[Tensor, Tensor]:
    """Indices (i, j), i < j, of every unordered task pair, in lexicographic order.

    Built on `device` directly (indexing with Python lists would copy them from the host, a
    synchronising copy on CUDA).
    """
    first, second = torch.triu_indices(num_tasks, num_tasks, offset=1, device=device)
    return first, second


def select_prototypes(rank_scores: Tensor, usable: Tensor, per_task: int) -> tuple[Tensor, Tensor]:
    """The `per_task` highest-scoring usable examples of each task (the high-confidence
    prototypes of section 4.2).

    rank_scores, usable: (T, B). Returns batch indices (T, k) and whether each selected entry
    is usable (T, k), with k = min(per_task, B); a task with fewer than k usable examples gets
    all of them, padded with unusable entries (which `prototype_pairs` masks out).
    """
    k = min(per_task, rank_scores.shape[1])
    keyed = torch.where(usable, rank_scores, torch.full_like(rank_scores, -torch.inf))
    index = keyed.topk(k, dim=1).indices
    return index, usable.gather(1, index)


def prototype_pairs(
    scores: Tensor,
    valid: Tensor,
    representation: Tensor,
    per_task: int,
    pairing: Pairing = "cross",
    distance_floor: float = 1e-3,
    rank_scores: Tensor | None = None,
) -> PrototypePairs:
    """Cross-task prototype pairs of one mini-batch (section 4.2, Algorithm 2 line 4).

    scores: (T, B) audit scores p_k(x) in [0, 1] of every task for every batch example.
    valid: (T, B) bool, the tasks' validity masks.
    representation: (B, D) shared representation f_theta(x).
    per_task: how many prototypes each task contributes (the highest audit scores among its
        usable examples: an example is usable when valid, its score finite and its
        representation row finite).
    pairing: for every unordered task pair (i, j), "cross" pairs every prototype of i with every
        prototype of j (k^2 pairs); "rank" pairs the r-th most confident prototype of i with the
        r-th of j (k pairs).
        A pair may hold the same example twice (x == y, two tasks' scores of one input): the
        audit's independent draws produce such pairs too, and the distance floor eps_d exists
        exactly for d ~ 0; they ask that one input get consistent scores across tasks.
    distance_floor: eps_d of d' = max(d, eps_d).
    rank_scores: (T, B) scores that order examples for selection (default: `scores`). The
        regularizer passes the raw scores, so a clipping squash does not create ties.

    Non-finite scores or representations never reach the arithmetic: they are replaced by zeros
    and their pairs masked out, so neither values nor gradients turn NaN.
    """
    score_ok = torch.isfinite(scores)
    row_ok = torch.isfinite(representation).all(dim=1)
    usable = valid & score_ok & row_ok.unsqueeze(0)
    clean_scores = torch.where(score_ok, scores, torch.zeros_like(scores))
    clean_rep = torch.where(row_ok.unsqueeze(1), representation, torch.zeros_like(representation))
    order = clean_scores.detach() if rank_scores is None else rank_scores.detach()
    index, selected_ok = select_prototypes(order, usable, per_task)
    selected = clean_scores.gather(1, index)
    first, second = task_pairs(scores.shape[0], scores.device)
    if pairing == "cross":
        left, right = (slice(None), slice(None), None), (slice(None), None, slice(None))
    elif pairing == "rank":
        left = right = (slice(None), slice(None))
    else:
        raise ValueError(f"unknown pairing {pairing!r}")
    gap = selected[first][left] - selected[second][right]
    mask = selected_ok[first][left] & selected_ok[second][right]
    embeddings = clean_rep[index]
    distance = cosine_distance(embeddings[first][left], embeddings[second][right])
    return PrototypePairs(
        gap=gap.reshape(-1),
        distance=distance.clamp_min(distance_floor).reshape(-1),
        mask=mask.reshape(-1),
        index=index,
        selected_ok=selected_ok,
    )
