"""Variable-length clinical sequences held in memory, padded per batch.

Both clinical readers (MIMIC-III and eICU) turn every ICU stay into an hourly feature matrix
of its own length. A split stores all stays of one partition back to back in one tensor
(`features`, shape (total_steps, F)) with `offsets` marking where each stay starts, so no
memory is spent on padding. `batch(index)` pads only to the longest stay in the batch.

Targets come in two kinds:

* per-stay targets, shape (N, ...): e.g. mortality (mask, label) or 25 phenotype labels;
* per-step targets, shape (total_steps, ...): e.g. decompensation (mask, label) or length of
  stay (mask, remaining hours), stored along `features` and padded like them.

Padded steps get zeros everywhere, so a padded step's mask is 0 and no loss or metric sees it.
A batch carries "input" (B, T, F), "lengths" (B,), one entry per task and "example_id" (B,),
the position of the stay in its split (`names[example_id]` is the stay's file or id).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from relif_ray.data.splits import Batch, Split

STD_FLOOR = 1e-7
"""Smallest standard deviation used for standardisation (the benchmark's Normalizer floor)."""


@dataclass
class SequenceSplit(Split):
    """Stays of one split, concatenated along time; see the module docstring."""

    features: Tensor
    offsets: Tensor
    stay_targets: dict[str, Tensor]
    step_targets: dict[str, Tensor]
    names: list[str]

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def lengths(self) -> Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    def example_names(self) -> list[str]:
        return self.names

    def batch(self, index: Tensor) -> Batch:
        """The stays `index` (B,) padded to the longest; an (S, B) index (a stacked fused
        step's, one row per seed) pads every seed's rows to the longest of all."""
        starts = self.offsets[index]
        lengths = self.offsets[index + 1] - starts
        steps = torch.arange(int(lengths.max()))
        valid = steps < lengths[..., None]
        rows = torch.where(valid, starts[..., None] + steps, 0)
        batch: Batch = {
            "input": _gather_padded(self.features, rows, valid),
            "lengths": lengths,
            "example_id": index.clone(),
        }
        for name, target in self.stay_targets.items():
            batch[name] = target[index]
        for name, target in self.step_targets.items():
            batch[name] = _gather_padded(target, rows, valid)
        return batch


def _gather_padded(values: Tensor, rows: Tensor, valid: Tensor) -> Tensor:
    """values[rows] with zeros wherever `valid` is False; shape (B, T, ...)."""
    gathered = values[rows]
    shape = valid.shape + (1,) * (gathered.dim() - valid.dim())
    return gathered * valid.reshape(shape).to(gathered.dtype)


def build_split(
    stays: list[np.ndarray],
    stay_targets: dict[str, np.ndarray],
    step_targets: dict[str, list[np.ndarray]],
    names: list[str],
) -> SequenceSplit:
    """Concatenate per-stay arrays into a `SequenceSplit` (float32 features and targets)."""
    lengths = torch.tensor([len(stay) for stay in stays], dtype=torch.long)
    offsets = torch.zeros(len(stays) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, dim=0)
    return SequenceSplit(
        features=torch.from_numpy(np.concatenate(stays).astype(np.float32, copy=False)),
        offsets=offsets,
        stay_targets={k: torch.from_numpy(v.astype(np.float32)) for k, v in stay_targets.items()},
        step_targets={
            k: torch.from_numpy(np.concatenate(v).astype(np.float32))
            for k, v in step_targets.items()
        },
        names=list(names),
    )


@dataclass(frozen=True)
class Standardizer:
    """Per-column (x - mean) / std on chosen columns, with statistics from training stays.

    The statistics are the mean and the sample standard deviation (N - 1) over every hourly
    step of every training stay, as the benchmark's Normalizer computes them; stds below
    1e-7 are raised to 1e-7. Columns not listed (one-hot values, observation masks) are
    left as they are.
    """

    columns: tuple[int, ...]
    means: tuple[float, ...]
    stds: tuple[float, ...]

    @classmethod
    def fit(cls, stays: list[np.ndarray], columns: list[int]) -> Standardizer:
        count = sum(len(stay) for stay in stays)
        total = sum(stay[:, columns].sum(axis=0, dtype=np.float64) for stay in stays)
        squares = sum((stay[:, columns].astype(np.float64) ** 2).sum(axis=0) for stay in stays)
        means = total / count
        variances = (squares - count * means**2) / max(count - 1, 1)
        stds = np.maximum(np.sqrt(np.maximum(variances, 0.0)), STD_FLOOR)
        return cls(
            columns=tuple(columns),
            means=tuple(float(x) for x in means),
            stds=tuple(float(x) for x in stds),
        )

    def apply(self, stay: np.ndarray) -> np.ndarray:
        """The standardised copy of one stay's (steps, F) matrix, as float32."""
        out = stay.astype(np.float64)
        columns = list(self.columns)
        out[:, columns] = (out[:, columns] - np.array(self.means)) / np.array(self.stds)
        return out.astype(np.float32)


def carry_forward(
    event_steps: np.ndarray, values: np.ndarray, steps: int, normal: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per step: whether observed (0/1), and the last value seen up to it (normal before any).

    `event_steps` and `values` are in file order; of several events in one step the last
    wins (as the benchmark's discretizer overwrites earlier ones).
    """
    per_step = np.full(steps, normal)
    observed = np.zeros(steps, dtype=bool)
    if len(event_steps):
        # the last event of each step wins: unique() keeps the first of the reversed arrays
        unique_steps, first_in_reversed = np.unique(event_steps[::-1], return_index=True)
        per_step[unique_steps] = values[::-1][first_in_reversed]
        observed[unique_steps] = True
    source = np.maximum.accumulate(np.where(observed, np.arange(steps), -1))
    filled = np.where(source >= 0, per_step[np.maximum(source, 0)], normal)
    return observed.astype(np.float64), filled
