"""What a training run does when: the batch order of each epoch, the run's step budget, and
the epoch-indexed learning-rate schedule. Plain torch; the engine (`relif_ray.engine`) follows
them, and a resumed run follows them from where it stopped."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.optim.lr_scheduler import CosineAnnealingLR, LRScheduler, StepLR

from relif_ray.config import TrainConfig


def epoch_permutation(n: int, seed: int, epoch: int) -> Tensor:
    """The batch order of one epoch: a function of (seed, epoch) only."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator)


def step_budget(epochs: int | None, max_steps: int | None, steps_per_epoch: int) -> int:
    """Optimisation steps of a run: `max_steps` alone trains exactly that many (across epoch
    boundaries, the last epoch partial); `epochs` alone trains that many full epochs; with
    both, the smaller budget wins. The config guarantees that one of them is set."""
    if epochs is None:
        return int(max_steps)
    if max_steps is None:
        return epochs * steps_per_epoch
    return min(epochs * steps_per_epoch, max_steps)


def steps_to_take(step: int, count: int | None, steps_per_epoch: int, total_steps: int) -> int:
    """How many steps a run at `step` trains next: `count` (None: to the end of the current
    epoch), never past the step budget `total_steps`."""
    if count is None:
        count = (step // steps_per_epoch + 1) * steps_per_epoch - step
    return max(0, min(count, total_steps - step))


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, train: TrainConfig, epochs: int
) -> LRScheduler | None:
    """The epoch-indexed learning-rate schedule of `train.scheduler` (None: constant).

    The engine calls its `step()` at the end of each complete epoch, as LibMTL's Trainer does
    (`scheduler.step()` after each epoch's evaluation), so epoch e (0-based) trains at the
    schedule's rate for e: StepLR lr * gamma^(e // step_size), CosineAnnealingLR
    eta_min + (lr - eta_min) (1 + cos(pi e / horizon)) / 2. A budget that ends inside an epoch
    (`max_steps`) trains that partial epoch at its epoch's rate and steps nothing after it: no
    optimiser step follows, so the numbers do not depend on that choice. `epochs`: the epochs
    of the run's budget, the default cosine horizon.
    """
    if train.scheduler == "step":
        return StepLR(optimizer, step_size=train.scheduler_step_size, gamma=train.scheduler_gamma)
    if train.scheduler == "cosine":
        horizon = train.scheduler_epochs if train.scheduler_epochs is not None else epochs
        return CosineAnnealingLR(optimizer, T_max=horizon, eta_min=train.scheduler_min_lr)
    return None
