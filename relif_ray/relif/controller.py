"""The violation-rate feedback controller of ReLiF (paper section 4.4, Algorithm 2 line 7).

    r~_t = a r_t + (1 - a) r~_{t-1},  r~ at the first update = r of that step   (paper Eq. 11)
    lambda_t = clip(lambda_{t-1} (1 + eta (r~_t - r*)), lambda_min, lambda_max)  (paper Eq. 12)

The step counter t counts controller updates, i.e. training steps that had at least one valid
finite prototype pair: a step without pairs leaves the controller untouched (section 4.5), so
it neither ages the violation EMA nor advances the warmup. Lambda changes only once t > T_w
(Algorithm 2: "if t > T_w"), so the first T_w updates use lambda_0. The updated lambda is the
one applied to the current step's loss (section 4.4).

The state lives in buffers (lambda, r_ema, updates), so it travels in `state_dict()` and
with `.to(device)`; `update` is pure tensor arithmetic with no host synchronisation. Whether a
step had pairs arrives as a 0-dim bool tensor `active` (computed on the device), and an
inactive update leaves every buffer as it was through `torch.where`, not a Python `if`.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor, nn

from relif_ray.config import ReLiFConfig
from relif_ray.relif.surrogate import constant


class ViolationController(nn.Module):
    """Multiplicative lambda controller driven by the smoothed training violation rate.

    adaptive=False is the paper's static-lambda ablation: lambda stays at lambda0 while the
    violation EMA is still tracked for the trace.
    """

    lambda_: Tensor
    r_ema: Tensor
    updates: Tensor

    def __init__(
        self,
        lambda0: float,
        lambda_min: float,
        lambda_max: float,
        warmup_steps: int,
        violation_ema: float,
        r_star: float,
        eta: float,
        adaptive: bool = True,
    ) -> None:
        super().__init__()
        self.lambda_min = lambda_min
        self.lambda_max = lambda_max
        self.warmup_steps = warmup_steps
        self.violation_ema = violation_ema
        self.r_star = r_star
        self.eta = eta
        self.adaptive = adaptive
        self.register_buffer("lambda_", torch.tensor(float(lambda0)))
        self.register_buffer("r_ema", torch.tensor(float("nan")))
        self.register_buffer("updates", torch.tensor(0, dtype=torch.long))

    @classmethod
    def from_config(cls, config: ReLiFConfig) -> ViolationController:
        """The controller of a ReLiF config: lambda0 (0 without the Lipschitz branch, which
        keeps lambda at 0), adaptive where `ReLiFConfig.controller_adapts` says so. Only a
        ReLiF that is on builds one, so `enabled` is not asked of the config."""
        return cls(
            lambda0=config.lambda0 if config.lipschitz_branch else 0.0,
            lambda_min=config.lambda_min,
            lambda_max=config.lambda_max,
            warmup_steps=config.warmup_steps,
            violation_ema=config.violation_ema,
            r_star=config.r_star,
            eta=config.eta,
            adaptive=replace(config, enabled=True).controller_adapts(),
        )

    def update(self, r: Tensor, active: Tensor | bool = True) -> Tensor:
        """Feed the violation rate r_t of one step; return lambda_t (detached).

        active: whether the step had pairs (a bool or 0-dim bool tensor); when False the state
        is left exactly as it was and the current lambda is returned.
        """
        if isinstance(active, bool):  # filled on the device: no host-to-device copy
            active = torch.full((), active, device=self.r_ema.device)
        r = r.detach()
        r = r if r.dtype == self.r_ema.dtype else r.to(self.r_ema.dtype)
        weight = self.violation_ema
        smoothed = constant(weight, r) * r + constant(1 - weight, r) * self.r_ema
        r_ema = torch.where(torch.isnan(self.r_ema), r, smoothed)
        self.r_ema.copy_(torch.where(active, r_ema, self.r_ema))
        self.updates.add_(active)
        if self.adaptive:
            step = constant(self.eta, r) * (self.r_ema - constant(self.r_star, r))
            factor = constant(1.0, r) + step
            proposed = (self.lambda_ * factor).clamp(self.lambda_min, self.lambda_max)
            change = active & (self.updates > constant(self.warmup_steps, self.updates))
            self.lambda_.copy_(torch.where(change, proposed, self.lambda_))
        return self.lambda_.clone()


PAPER_NYUV2_STEPS = 200 * math.floor(795 / 8)
"""Controller updates of the paper's NYUv2 run: 200 epochs of 795 images in batches of 8
(LibMTL's budget, which ours follows), 99 full batches per epoch (the last partial batch is
dropped, by `relif_ray.engine` as by LibMTL's loader), so 19,800 steps, at eta 1e-3 with a
100-step warmup."""


def scale_to_budget(
    steps: int,
    eta: float = 1e-3,
    warmup_steps: int = 100,
    reference_steps: int = PAPER_NYUV2_STEPS,
) -> tuple[float, int]:
    """(eta, warmup) for a run of `steps` controller updates that moves lambda as the paper's
    NYUv2 run does: eta x steps and warmup / steps as there (defaults: eta 1e-3 and warmup 100
    over `PAPER_NYUV2_STEPS`; Table 5). The multiplicative update changes log lambda by about
    eta (r~_t - r*) per step, so over a run it moves by about eta x steps x mean(r~ - r*): at
    eta 1e-3 a 24-step demo would move lambda by 0.1% where the paper's run moves it by
    factors. Every sweep's controller-budget rule uses it
    (`relif_ray.sweep.compose.controller_budget`); warmup is at least 1 step."""
    if steps <= 0:
        raise ValueError(f"steps must be positive, got {steps}")
    return eta * reference_steps / steps, max(1, round(warmup_steps * steps / reference_steps))
