"""The pieces of ReLiF's training surrogate (paper section 4.2-4.3, Algorithm 2).

- `huber_rho`: the Huber transform of a gap (paper Eq. 8).
- `huberized_hinge`: the smooth hinge on the normalized margin (paper Eq. 9).
- `cosine_distance`: d(u, v) = (1 - cos(u, v)) / 2 on L2-normalized embeddings.
- `prototype_pairs`: the mini-batch set P_t of cross-task prototype pairs with their signed
  gaps Delta s = p_i(x) - p_j(y) and clipped distances d' = max(d, eps_d).
- `masked_quantiles`: quantiles of the masked-in entries of each row (the scale buffers' and
  the running squash's batch quantiles).

Everything here is a pure tensor function: no state, no host synchronisation.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

Pairing = Literal["cross", "rank"]


def constant(value: float, like: Tensor) -> Tensor:
    """`value` as a 0-dim tensor of `like`'s dtype and device, made once per (value, dtype,
    device) and never written to.

    A Python number in an ATen call is wrapped into a host tensor and converted on every call:
    four more ATen calls, host time on every GPU step. The same arithmetic with a cached
    constant costs none of them and gives the same numbers on a CPU (the number is rounded to
    the dtype either way; on CUDA a division by a host number is a multiplication by its
    reciprocal, so there a constant is the exact division). Its first use copies it to the
    device, once per process. Inside a compiled step (`regularizer.compiled_regularizer`) it is
    made in the graph, whose compiler folds it: torch.compile would trace through the cache.
    """
    if torch.compiler.is_compiling():
        return torch.tensor(float(value), dtype=like.dtype, device=like.device)
    return _cached_constant(float(value), like.dtype, like.device)


@functools.cache
def _cached_constant(value: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    with torch.inference_mode(False):  # usable by autograd even if first made in evaluation
        return torch.tensor(value, dtype=dtype, device=device)


def huber_rho(u: Tensor, beta: float) -> Tensor:
    """rho_beta(u) = u^2 / (2 beta) for |u| <= beta, |u| - beta / 2 otherwise (paper Eq. 8).

    Even in u, continuous with a continuous derivative at |u| = beta.
    """
    magnitude = u.abs()
    return torch.where(
        magnitude <= constant(beta, u),
        u * u / constant(2 * beta, u),
        magnitude - constant(beta / 2, u),
    )


def huberized_hinge(z: Tensor, mu: float) -> Tensor:
    """phi_mu(z) = 0 for z <= 0, z^2 / (2 mu) on (0, mu], z - mu / 2 above (paper Eq. 9).

    It never exceeds the hinge (z)_+ and stays within mu / 2 of it (the paper's Theorem B.4).
    """
    positive = z.clamp_min(0.0)
    return torch.where(
        positive <= constant(mu, z),
        positive * positive / constant(2 * mu, z),
        positive - constant(mu / 2, z),
    )


def cosine_distance(u: Tensor, v: Tensor) -> Tensor:
    """d(u, v) = (1 - cos(u, v)) / 2 in [0, 1], over the last dimension (broadcasting).

    Embeddings are L2-normalized first (a zero vector stays zero, so its cosine is 0 and its
    distance 1/2 to everything, rather than NaN).
    """
    cosine = (F.normalize(u, dim=-1) * F.normalize(v, dim=-1)).sum(-1)
    clamped = cosine.clamp(-1.0, 1.0)  # a number bound: its backward is cheaper than a tensor's
    return (constant(1.0, cosine) - clamped) / constant(2.0, cosine)


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
    synchronising copy on CUDA), once per (num_tasks, device): a constant, not a kernel
    launch per training step; in a compiled step, in the graph (as `constant`).
    """
    if torch.compiler.is_compiling():
        return _task_pair_indices(num_tasks, device)
    return _cached_task_pairs(num_tasks, device)


def _task_pair_indices(num_tasks: int, device: torch.device | None) -> tuple[Tensor, Tensor]:
    first, second = torch.triu_indices(num_tasks, num_tasks, offset=1, device=device)
    return first, second


_cached_task_pairs = functools.cache(_task_pair_indices)


def select_prototypes(rank_scores: Tensor, usable: Tensor, per_task: int) -> tuple[Tensor, Tensor]:
    """The `per_task` highest-scoring usable examples of each task (the high-confidence
    prototypes of section 4.2).

    rank_scores, usable: (T, B). Returns batch indices (T, k) and whether each selected entry
    is usable (T, k), with k = min(per_task, B); a task with fewer than k usable examples gets
    all of them, padded with unusable entries (which `prototype_pairs` masks out).
    """
    k = min(per_task, rank_scores.shape[1])
    keyed = torch.where(usable, rank_scores, constant(-torch.inf, rank_scores))
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
    score_ok = is_finite(scores)
    row_ok = is_finite(representation).all(dim=1)
    usable = valid & score_ok & row_ok
    clean_scores = torch.where(score_ok, scores, constant(0.0, scores))
    clean_rep = torch.where(row_ok.unsqueeze(1), representation, constant(0.0, representation))
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


def is_finite(values: Tensor) -> Tensor:
    """torch.isfinite in two ATen calls rather than eleven: x - x is exactly 0 for a finite x
    and NaN for an infinite or NaN one."""
    return torch.logical_not(values - values)


_NUMPY_FLOATS = {torch.float32: np.float32, torch.float64: np.float64}


def masked_quantiles(values: Tensor, mask: Tensor, levels: Sequence[float]) -> list[Tensor]:
    """Per level, the quantile over the last dimension of the entries of `values` where `mask`
    is set, with linear interpolation (numpy's default); NaN for a row without such entries.

    Bit for bit `torch.nanquantile(values.where(mask, nan), level, dim=-1)` (as torch computes
    it: the level rounded to the values' dtype, the rank level * (count - 1) in float64, the
    interpolation weight back in the values' dtype; tested against it), in about a fifth of its
    ATen calls, each a kernel launch on CUDA: no range check of the level (which reads a value
    on the host on CPU), one sort shared by every level. `mask` broadcasts against `values`,
    which must be float32 or float64 (as for torch.nanquantile).
    """
    mask = mask.expand_as(values)
    ordered = torch.where(mask, values, constant(torch.nan, values)).sort(dim=-1).values
    count = mask.sum(-1, keepdim=True, dtype=torch.float64)
    last = count - constant(1.0, count)
    quantiles = []
    for level in levels:
        rounded = float(_NUMPY_FLOATS[values.dtype](level))  # as torch.nanquantile holds it
        rank = (last * constant(rounded, last)).clamp_min(0.0)
        below = rank.floor()
        weight = (rank - below).to(values.dtype)
        low = ordered.gather(-1, below.long())
        high = ordered.gather(-1, rank.ceil().long())
        quantiles.append(low.lerp(high, weight).squeeze(-1))
    return quantiles
