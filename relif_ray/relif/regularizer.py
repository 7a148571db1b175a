"""The ReLiF regularizer: lambda_t * L_lip of one training step (paper section 4, Algorithm 2).

Per step, given every task's per-example audit score and the shared representation:

1. Scores that are not probabilities (NYUv2 depth/normal: unbounded feature norms) are squashed
   into [0, 1] with the audit's own squash (`relif_ray.squash.squash`, appendix A.3). With
   `squash="erm"` (the paper's: "the same scalar score is used to form
   both the fixed-audit gaps and the training-time surrogate gaps", section 3) q10/q90 are the
   fixed same-seed ERM validation quantiles of `squash_constants`, exactly the audit's. With
   `squash="running"` they are running EMAs (weight `squash_ema`, first value = the first
   batch's quantiles) of each task's batch quantiles over its valid finite scores, without
   gradient (our earlier choice, kept as an option). With `squash_gradient="clip"` (the
   paper's) a clipped score passes no gradient; with "straight_through" (our extension) the
   forward value is the same clipped score, but the backward pass uses the slope of the
   squash's affine map everywhere (`squash_with_gradient`). With
   `surrogate_score="logistic"` (our extension) the surrogate's scores are instead a smooth,
   never-flat logistic of the same ERM-normalised score (`logistic_squash`). The trace's
   `clipped` is the
   share of squashed-task prototype scores clipped at 0 or 1 (in the forward value).
2. Prototype pairs P_t (`surrogate.prototype_pairs`): signed gaps Delta s, clipped distances d'.
3. Scale buffers (section 4.2): tau_t = EMA of Quantile_q(|Delta s|), kappa_t = EMA of
   Quantile_q(d') over P_t, q = `scale_quantile` (linear interpolation, as numpy's default),
   EMA weight `scale_ema`, stop-gradient, clamped below at `scale_floor`. The first step with
   pairs initialises them to that step's quantiles (the paper leaves tau_0, kappa_0 open; this
   mirrors its r~_0 = r_0). tau is the quantile of the raw |Delta s|, not of rho_beta(|Delta s|):
   the paper defines it so and notes that applying rho before dividing by tau makes the margin
   "scale-normalized but not exactly scale-invariant" (appendix B).
4. z = rho_beta(|Delta s|) / tau_t - d' / kappa_t, L_lip = mean phi_mu(z), r_t = mean 1[z > 0].
5. The controller turns r_t into lambda_t; the returned loss is lambda_t (detached) * L_lip,
   with `clip_share_penalty` (our extension) lambda_t * (L_lip + `clip_share_penalty`).

A step with no valid finite pair changes no state (section 4.5): its loss is an exact zero
(with exactly zero gradients) and its trace r / loss_lip are NaN. That case is decided on the
device, never on the host: every buffer update is a `torch.where` on the step's `has_pairs`
flag, so a training step has no host synchronisation here (no `.item()`, no `bool(tensor)`),
and a CUDA step can be queued while the previous one still runs. Gradients reach the scores and
the representation through L_lip only; every buffer update is computed from detached values.

Precision: the regularizer computes in the dtype of the scores it is given; under bf16
autocast the engine hands it fp32 scores and representation, so quantiles, scales and the
controller always run in fp32 (or fp64 in tests).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from relif_ray.config import ReLiFConfig, SquashGradient
from relif_ray.errors import UserError
from relif_ray.relif.controller import ViolationController
from relif_ray.relif.surrogate import (
    PrototypePairs,
    constant,
    huber_rho,
    huberized_hinge,
    is_finite,
    masked_quantiles,
    prototype_pairs,
)
from relif_ray.squash import SQUASH_EPS, SQUASH_QUANTILES, normalised_score, squash

STAT_KEYS = ("lambda", "r", "r_ema", "tau", "kappa", "loss_lip", "clipped")
"""The statistics of one step, in this order: lambda_t, the batch violation rate r_t, its EMA
r~_t, the scale buffers tau_t and kappa_t, L_lip, and the share of squashed prototype scores
clipped. The one home of these names: a trial's trace and its per-epoch results use them."""
CONTROLLER_KEYS = ("lambda", "r_ema")
"""The controller's own state among `STAT_KEYS` (lambda_t and r~_t, paper Eqs. 11-12): what a
sweep's progress table shows."""

TaskScores = dict[str, tuple[Tensor, Tensor]]


class ReLiFRegularizer(nn.Module):
    """lambda_t * L_lip and its statistics; its buffers are the ReLiF part of a checkpoint.

    Ablations (the paper's MIMIC-III component ablation): quantile_alignment=False fixes
    tau = kappa = 1; controller="static" fixes lambda at lambda0; lipschitz_branch=False fixes
    lambda at 0 and returns no loss, while every statistic is still computed.
    """

    tau: Tensor
    kappa: Tensor
    squash_low: Tensor
    squash_high: Tensor

    def __init__(self, config: ReLiFConfig, task_names: list[str]) -> None:
        super().__init__()
        self.config = config
        self.task_names = list(task_names)
        self.controller = ViolationController.from_config(config)
        initial_scale = float("nan") if config.quantile_alignment else 1.0
        self.register_buffer("tau", torch.tensor(initial_scale))
        self.register_buffer("kappa", torch.tensor(initial_scale))
        self._squashed_rows_cache: dict[tuple[bool, ...], Tensor] = {}
        low, high = _fixed_squash_bounds(config, self.task_names)
        self.register_buffer("squash_low", low)
        self.register_buffer("squash_high", high)

    def forward(
        self,
        scores: TaskScores,
        representation: Tensor,
        score_is_probability: dict[str, bool] | None = None,
    ) -> tuple[Tensor | None, dict[str, Tensor]]:
        """(lambda_t * L_lip, detached scalar stats keyed by `STAT_KEYS`).

        scores: task -> (raw audit score (B,), bool valid mask (B,)), differentiable.
        representation: (B, D) shared representation.
        score_is_probability: task -> whether its raw score is already in [0, 1] (default:
            every task's is); other scores are squashed as `relif.squash` says (step 1 above).

        The loss is a 0-dim tensor (an exact 0 with zero gradients on a step without pairs),
        None only for the lipschitz_branch=False ablation, a fixed choice of the config.
        """
        if score_is_probability is None:
            score_is_probability = dict.fromkeys(self.task_names, True)
        raw = torch.stack([scores[name][0] for name in self.task_names])
        valid = torch.stack([_as_bool(scores[name][1]) for name in self.task_names])
        squashed_rows = self._squashed_rows(score_is_probability)
        if self.config.squash == "erm":
            low, high = self.squash_low, self.squash_high
        else:
            low, high = self._squash_quantiles(raw.detach(), valid)
        any_squashed = not all(score_is_probability[name] for name in self.task_names)
        surrogate_scores, clipped = raw, None  # probabilities only: nothing to squash
        if any_squashed:
            surrogate_scores, clipped = self._squash(raw, low, high, squashed_rows)
        pairs = prototype_pairs(
            surrogate_scores,
            valid,
            representation,
            per_task=self.config.prototypes_per_task,
            pairing=self.config.prototype_pairing,
            distance_floor=self.config.distance_floor,
            rank_scores=raw,
        )
        count = pairs.mask.count_nonzero()
        has_pairs = count > 0
        if self.config.squash == "running":
            self.squash_low.copy_(torch.where(has_pairs, low, self.squash_low))
            self.squash_high.copy_(torch.where(has_pairs, high, self.squash_high))
        scales = torch.stack([self.tau, self.kappa])
        if self.config.quantile_alignment:
            scales = self._update_scales(pairs, has_pairs, scales)
        margin = self._margin(pairs, torch.where(has_pairs, scales, constant(1.0, scales)))
        loss_lip, violation_rate = self._loss_and_violation_rate(pairs, margin, count)
        weight = self.controller.update(violation_rate, active=has_pairs)
        stats = self._stats(
            r=torch.where(has_pairs, violation_rate, constant(torch.nan, violation_rate)),
            loss_lip=torch.where(has_pairs, loss_lip.detach(), constant(torch.nan, loss_lip)),
            scales=scales,
            clipped=_prototype_share(clipped, pairs, squashed_rows, self.tau),
        )
        if not self.config.lipschitz_branch:
            return None, stats
        if self.config.clip_share_penalty and any_squashed:  # our extension: lambda_t (L_lip + P)
            loss_lip = loss_lip + self._penalty(raw, valid, (low, high), squashed_rows, has_pairs)
        return _as_dtype(weight, loss_lip.dtype) * loss_lip, stats

    def _penalty(
        self,
        raw: Tensor,
        valid: Tensor,
        bounds: tuple[Tensor, Tensor],
        squashed_rows: Tensor,
        has_pairs: Tensor,
    ) -> Tensor:
        """`clip_share_penalty` on this step's scores; an exact zero (with zero gradients) on a
        step without pairs, like L_lip."""
        penalty = clip_share_penalty(raw, valid, *_placeholders(*bounds), squashed_rows)
        return torch.where(has_pairs, penalty, constant(0.0, penalty))

    def _margin(self, pairs: PrototypePairs, scales: Tensor) -> Tensor:
        """z = rho_beta(|Delta s|) / tau_t - d' / kappa_t, with `scales` = (tau_t, kappa_t)
        (rho is even: it takes the signed gap).

        Without pairs the scales may still be NaN (never initialised); the caller's unit
        placeholders then keep the (masked-out) margins and their zero gradients finite.
        """
        tau, kappa = scales.unbind()
        return huber_rho(pairs.gap, self.config.beta) / tau - pairs.distance / kappa

    def _loss_and_violation_rate(
        self, pairs: PrototypePairs, margin: Tensor, count: Tensor
    ) -> tuple[Tensor, Tensor]:
        """L_lip = mean phi_mu(z) and r_t = mean 1[z > 0] over the `count` valid pairs (step 4).

        Both means divide by the count converted once (as the division itself would convert
        it); the violation rate in the default dtype, that of an integer division."""
        count = _as_dtype(count.clamp_min(1), torch.get_default_dtype())
        hinge = huberized_hinge(margin, self.config.mu)
        loss_lip = torch.where(pairs.mask, hinge, constant(0.0, hinge)).sum()
        loss_lip = loss_lip / _as_dtype(count, loss_lip.dtype)
        violations = (pairs.mask & (margin.detach() > constant(0.0, margin))).count_nonzero()
        return loss_lip, _as_dtype(violations, count.dtype) / count

    def _squash_quantiles(self, raw: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        """Candidate running (q10, q90) per task after seeing this batch (not yet stored)."""
        usable = valid & is_finite(raw)
        batch_low, batch_high = masked_quantiles(raw, usable, SQUASH_QUANTILES)
        return (
            _ema(self.squash_low, batch_low.to(self.squash_low.dtype), self.config.squash_ema),
            _ema(self.squash_high, batch_high.to(self.squash_high.dtype), self.config.squash_ema),
        )

    def _squashed_rows(self, score_is_probability: dict[str, bool]) -> Tensor:
        """(T,) bool: which tasks' scores are squashed, built once (a per-step host-to-device
        copy would make the host wait). With the ERM squash each of them needs its constants."""
        flags = tuple(not score_is_probability[name] for name in self.task_names)
        cached = self._squashed_rows_cache.get(flags)
        if cached is not None:
            return cached
        if self.config.squash == "erm":
            missing = [
                name
                for name, squashed in zip(self.task_names, flags, strict=True)
                if squashed and name not in self.config.squash_constants
            ]
            if missing:
                raise UserError(
                    f"config field relif.squash_constants: relif.squash=erm needs [q10, q90] of "
                    f"the same-seed ERM validation scores for {', '.join(missing)}"
                )
        rows = torch.tensor(flags, device=self.squash_low.device)
        self._squashed_rows_cache[flags] = rows
        return rows

    def _squash(
        self, raw: Tensor, low: Tensor, high: Tensor, squashed_rows: Tensor
    ) -> tuple[Tensor, Tensor]:
        """(surrogate scores (T, B), clipped (T, B) bool: the audit's squash clips that entry).

        The surrogate scores are the audit's squash (`relif.surrogate_score: audit`) or its
        logistic (`logistic_squash`). A task without any usable score yet has NaN quantiles
        (`_placeholders`)."""
        low, high = _placeholders(low, high)
        low, high = low[:, None], high[:, None]
        if self.config.surrogate_score == "logistic":
            squashed = logistic_squash(raw, low, high)
            audited = normalised_score(raw.detach(), low, high)  # the audit clips it at 0 and 1
        else:
            squashed = squash_with_gradient(raw, low, high, self.config.squash_gradient)
            audited = squashed  # the audit's squash itself (no second map: the step's op budget)
        at_bound = (audited <= constant(0.0, audited)) | (audited >= constant(1.0, audited))
        rows = squashed_rows[:, None]
        return torch.where(rows, squashed, raw), rows & at_bound

    def _update_scales(self, pairs: PrototypePairs, has_pairs: Tensor, scales: Tensor) -> Tensor:
        """Step 3 for tau and kappa at once: the new (tau, kappa) from the previous `scales`,
        also written to the buffers (unchanged on a step without pairs)."""
        values = torch.stack([pairs.gap.detach().abs(), pairs.distance.detach()])
        (estimate,) = masked_quantiles(values, pairs.mask, (self.config.scale_quantile,))
        updated = _ema(scales, estimate.to(scales.dtype), self.config.scale_ema)
        updated = torch.where(has_pairs, updated.clamp_min(self.config.scale_floor), scales)
        tau, kappa = updated.unbind()
        self.tau.copy_(tau)
        self.kappa.copy_(kappa)
        return updated

    def _stats(
        self, r: Tensor, loss_lip: Tensor, scales: Tensor, clipped: Tensor
    ) -> dict[str, Tensor]:
        """Fresh detached copies (one tensor, cut into `STAT_KEYS`): the engine keeps them past
        later in-place buffer updates. `scales`: (tau, kappa) after this step."""
        controller = self.controller
        parts = (controller.lambda_, r, controller.r_ema, scales, loss_lip, clipped)
        stacked = torch.cat([part.view(-1) for part in parts])  # in the order of STAT_KEYS
        return dict(zip(STAT_KEYS, _as_dtype(stacked, self.tau.dtype).unbind(), strict=True))


def compiled_regularizer(regularizer: ReLiFRegularizer) -> nn.Module:
    """The regularizer's step through `torch.compile`, as one graph (`train.compile_relif`).

    Why: on a GPU the step (paper Algorithm 2, lines 4-9: squash, prototype pairs, the scale
    quantiles and EMAs, the Huber margin and hinge, the controller) is a chain of about 240
    small kernels forward and backward (docs/benchmarks.md), each with its own launch and
    memory round trip even when replayed from a graph; ERM + ReLiF's graphed step took 1.13x
    ERM's on an H200. Compiled (inductor, torch.compile's default backend), the elementwise
    chains become a few fused kernels, inside the whole-step CUDA graph too
    (`relif_ray.cuda_graph`: the compilation happens in its eager warm-up steps, the capture
    records the compiled kernels). fullgraph=True: a graph break would put host work back in
    every step, so it is an error, not a silent slowdown; dynamic=False: a step's shapes are
    fixed by the batch size. The module and its buffers are the same objects, so checkpoints
    are unchanged; the numbers are the eager step's up to the float rounding of fused
    kernels. Off by default until the GPU's rows decide (docs/benchmarks.md).

    torch.compile's caches are cleared first: a trial worker runs trials one after another
    (Tune reuses it), each regularizer's settings are constants of its graph, and a ninth graph
    of the same function (torch's recompile limit) would fail a fullgraph compile."""
    torch.compiler.reset()
    return torch.compile(regularizer, fullgraph=True, dynamic=False)


def squash_with_gradient(
    raw: Tensor, low: Tensor, high: Tensor, gradient: SquashGradient = "clip"
) -> Tensor:
    """The audit's squash of raw scores (`relif_ray.squash.squash`; paper appendix A),
    with the chosen gradient.

    "clip" (the paper's): the clip's own gradient, zero wherever it saturates. A prototype is
    a top score, so once a depth/normal score overshoots q90 nothing pulls it back.
    "straight_through" (our extension): the forward value is exactly the clipped one (the
    paper's "same scalar score" for surrogate and audit), the gradient is the affine map's
    slope 1 / (high - low + SQUASH_EPS) everywhere. It is value.detach() + (s - s.detach()) / width:
    the added term is an exact zero whose gradient is the slope, so the value is the clip's
    to the bit. A non-finite raw score carries no gradient, as under the clip. `low`/`high`
    broadcast against `raw` and must be finite.
    """
    squashed = squash(raw, low, high)
    if gradient == "clip":
        return squashed
    if gradient != "straight_through":
        raise ValueError(f"unknown squash gradient {gradient!r}")
    carrier = torch.where(torch.isfinite(raw), raw, 0.0)
    return squashed.detach() + (carrier - carrier.detach()) / (high - low + SQUASH_EPS)


LOGISTIC_SLOPE = 4.0
"""k of `logistic_squash`: sigmoid(k (u - 1/2)) has slope k / 4 at the band's middle u = 1/2,
so k = 4 matches the clip's slope there (1 per band width); it maps ERM's q10 and q90 to
sigmoid(-2) = 0.12 and sigmoid(2) = 0.88."""


def logistic_squash(raw: Tensor, low: Tensor, high: Tensor) -> Tensor:
    """sigmoid(LOGISTIC_SLOPE (u - 1/2)) of the ERM-normalised score u
    (`relif_ray.squash.normalised_score`):
    the surrogate score of `relif.surrogate_score: logistic` (ours, not the paper's).

    Why: the paper's surrogate uses the audit's clipped squash, so a prototype score pushed past
    ERM's q90 has gap 0 to the others there and passes no gradient; saturating is then a cheap
    way to lower L_lip, and the audit, which clips the same way, cannot see it. The logistic is
    strictly increasing, so scores beyond either clip point keep their order, their gaps and a
    gradient (smaller the further out they lie). The audit is unchanged: only the surrogate's
    scores differ from the audit's. A non-finite raw score stays non-finite (masked out of the
    pairs as under the clip).
    """
    slope = constant(LOGISTIC_SLOPE, raw)
    return torch.sigmoid(slope * (normalised_score(raw, low, high) - constant(0.5, raw)))


def clip_share_penalty(
    raw: Tensor, valid: Tensor, low: Tensor, high: Tensor, squashed_rows: Tensor
) -> Tensor:
    """The penalty of `relif.clip_share_penalty` (ours, not the paper's): summed over the
    squashed tasks, (Q_0.9(u) - 1)_+ + (0 - Q_0.1(u))_+, with Q the quantile (linear
    interpolation, differentiable through the sort) of the batch's valid finite normalised
    scores u (`normalised_score`, ERM's clip points at u = 0 and 1).

    Why: the share of a batch beyond ERM's q90 exceeds ERM's own share, 0.1, exactly when the
    batch's q90 of u exceeds 1 (likewise at q10 and 0). The penalty is 0 while a batch clips no
    more than ERM's share at either end and grows with how far the excess lies beyond the clip
    point, in band widths: it pulls back exactly the scores the clip would hide, with no
    constant of its own (lambda_t weights it with L_lip). raw, valid: (T, B); low, high: (T,)
    finite; squashed_rows: (T,) bool. A task without usable scores adds 0.
    """
    normalised = normalised_score(raw, low[:, None], high[:, None])
    usable = valid & is_finite(raw) & squashed_rows[:, None]
    q_low, q_high = masked_quantiles(normalised, usable, SQUASH_QUANTILES)
    zero = constant(0.0, normalised)
    excess = (q_high - constant(1.0, q_high)).clamp_min(0.0) + (zero - q_low).clamp_min(0.0)
    return torch.where(torch.isnan(excess), zero, excess).sum()


def _placeholders(low: Tensor, high: Tensor) -> tuple[Tensor, Tensor]:
    """(q10, q90) with a task's NaN quantiles (no usable score yet) replaced by 0 and 1: all its
    entries are masked out anyway, and the placeholders keep its (zero) gradients finite."""
    return low.nan_to_num(nan=0.0), high.nan_to_num(nan=1.0)


def _ema(previous: Tensor, estimate: Tensor, weight: float) -> Tensor:
    """(1 - w) previous + w estimate; the estimate itself where there is no previous value, and
    the previous value where this step has no estimate (NaN)."""
    blended = constant(1 - weight, previous) * previous + constant(weight, estimate) * estimate
    return torch.where(
        torch.isnan(previous), estimate, torch.where(torch.isnan(estimate), previous, blended)
    )


def _fixed_squash_bounds(config: ReLiFConfig, task_names: list[str]) -> tuple[Tensor, Tensor]:
    """Initial (q10, q90) buffers: the ERM constants where given (squash="erm"), else NaN."""
    nan = [float("nan"), float("nan")]
    bounds = [
        config.squash_constants.get(name, nan) if config.squash == "erm" else nan
        for name in task_names
    ]
    values = torch.tensor(bounds, dtype=torch.float32).reshape(len(task_names), 2)
    return values[:, 0].clone(), values[:, 1].clone()


def _prototype_share(
    clipped: Tensor | None, pairs: PrototypePairs, squashed_rows: Tensor, like: Tensor
) -> Tensor:
    """Share of the selected prototype scores of squashed tasks that the squash clipped (no
    gradient flows through them); NaN where no squashed task has a usable prototype, or
    (`clipped` None) no task is squashed. `like`: a tensor on the regularizer's device."""
    if clipped is None:
        return constant(torch.nan, like)
    chosen = clipped.gather(1, pairs.index) & pairs.selected_ok  # squashed tasks' only
    counted = pairs.selected_ok & squashed_rows[:, None]
    return chosen.count_nonzero() / counted.count_nonzero()  # 0 / 0 is NaN


def _as_bool(mask: Tensor) -> Tensor:
    return mask if mask.dtype == torch.bool else mask.bool()


def _as_dtype(value: Tensor, dtype: torch.dtype) -> Tensor:
    """`value` in `dtype`, without an ATen call (a no-op one still costs host time) where it
    already is."""
    return value if value.dtype == dtype else value.to(dtype)
