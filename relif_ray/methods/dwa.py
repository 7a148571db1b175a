"""DWA, Dynamic Weight Average (Liu, Johns & Davison, CVPR 2019, "End-to-End Multi-Task
Learning with Attention").

The task weights of epoch t are

    lambda_k(t) = K exp(w_k(t-1) / T) / sum_i exp(w_i(t-1) / T),
    w_k(t-1) = L_k(t-1) / L_k(t-2),

with L_k(e) the average training loss of task k over epoch e and temperature T (default 2.0,
the paper's). The first two epochs have no ratio and use lambda_k = 1 (the paper's
w_k(0) = w_k(1) = 1). The network gets one backward of sum_k lambda_k L_k; the ReLiF term is
added unweighted.

Checked against LibMTL's DWA (median-research-group/LibMTL, LibMTL/weighting/DWA.py, commit
2d842d6; the same code as the LibMTL 1.1.5 package, which the tests run as the reference) and
the authors' code (lorenmt/mtan, whose training loop LibMTL follows): LibMTL stores each
epoch's mean loss in `train_loss_buffer[:, epoch]` and uses the ratio of epochs e-1 and e-2
from epoch e = 2 on, as here.

The epoch averages are kept by the method: `backward` adds each step's losses to a running sum
(device tensors, no host sync), and `end_epoch` (the engine calls it after every full epoch)
turns the sum into the epoch's mean and keeps the last two means. All of it is in buffers, so a
checkpoint taken inside an epoch resumes with the same averages.
"""

from __future__ import annotations

import torch
from torch import Tensor

from relif_ray.config import GradientSource
from relif_ray.methods.base import LossWeighting
from relif_ray.methods.registry import option_in_range, register


def dwa_weights(older_means: Tensor, newer_means: Tensor, temperature: float) -> Tensor:
    """lambda_k = K softmax_k(w_k / T) with w_k = newer_k / older_k."""
    ratios = newer_means / older_means
    return len(ratios) * torch.softmax(ratios / temperature, dim=0)


@register
class DWA(LossWeighting):
    """Dynamic Weight Average of the task losses by their per-epoch rate of descent."""

    name = "dwa"
    citation = "Liu, Johns & Davison, CVPR 2019"
    capturable = True

    def __init__(
        self,
        task_names: list[str],
        seed: int = 0,
        temperature: float = 2.0,
        gradient_source: GradientSource = "parameters",
    ) -> None:
        super().__init__(task_names, seed=seed, gradient_source=gradient_source)
        self.temperature = option_in_range("temperature", temperature, "> 0")
        num_tasks = len(task_names)
        self.register_buffer("loss_sums", torch.zeros(num_tasks))
        self.register_buffer("steps_in_epoch", torch.zeros(()))
        self.register_buffer("epoch_means", torch.ones(2, num_tasks))
        """The mean losses of the last two full epochs: [older, newer]."""
        self.register_buffer("epochs_done", torch.zeros((), dtype=torch.long))

    def current_weights(self) -> Tensor:
        """This epoch's lambda: ones for the first two epochs (a mask: no host sync)."""
        weights = dwa_weights(self.epoch_means[0], self.epoch_means[1], self.temperature)
        return torch.where(self.epochs_done >= 2, weights, torch.ones_like(weights))

    def weighted_loss(self, losses: Tensor) -> tuple[Tensor, Tensor]:
        """sum_k w_k L_k with this epoch's weights; the step's losses join the epoch's sums."""
        weights = self.current_weights()
        self.loss_sums.add_(losses.detach().to(self.loss_sums))
        self.steps_in_epoch.add_(1)
        return (weights * losses).sum(), weights

    def end_epoch(self) -> None:
        """The epoch's mean losses become the newer of the two kept; the sums start again."""
        means = self.loss_sums / self.steps_in_epoch
        self.epoch_means.copy_(torch.stack([self.epoch_means[1], means]))
        self.loss_sums.zero_()
        self.steps_in_epoch.zero_()
        self.epochs_done.add_(1)
