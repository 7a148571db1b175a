"""The squash and the other audit interfaces: how a raw audit score becomes a score in [0, 1].

A leaf of the library (numpy only, no storage, no experiment code), so the audit
(`relif_ray.audit`), ReLiF (`relif_ray.relif`) and own training loops use it as plain math.
Which reference run defines the constants, and how they travel in an experiment directory, is
the policy of `relif_ray.reference`.

Audit scores that are not probabilities (NYUv2 depth and normal: the valid-region mean L2 norm
of the head's decoder feature map) are mapped into [0, 1] by the squash of the paper's
appendix A (audit scores):

    s -> clip((s - q10) / (q90 - q10 + 1e-6), 0, 1)

where q10 and q90 are the 10th and 90th percentiles (numpy's linear interpolation, in
float64) of that task's valid VALIDATION raw scores of the same-seed ERM reference run. One
squash serves the fixed-delta audit, ReLiF's training surrogate and a trial's live validation
audit, because "the same scalar score is used to form both the fixed-audit gaps and the
training-time surrogate gaps" (paper section 3, appendix A.3).

This module is the formula's one home; other docstrings point here. It is also the home of
the audit interfaces (`AUDIT_INTERFACES`) that `analysis.audit` and the report's
"Audit-interface sensitivity" table re-audit the same saved scores under, each built from the
same-seed ERM reference's valid validation raw scores (the paper asks "is fairness truly
fair?": a cut in Bias should not be an artefact of the clip):

- "q10-q90" (a): the paper's squash above; the only one used in training;
- "q1-q99" (b): the same squash with the wider band (q1, q99), which clips about 1% of ERM's
  validation scores each side instead of 10%;
- "ecdf" (c): the reference's empirical CDF, a rank map with no clip inside the reference's
  range: F(s) = #{r_i <= s} / n over the n reference scores r_i (right-continuous, no
  interpolation: a score tied with reference values counts them; F = 0 below the smallest,
  1 from the largest on), in float64 (`empirical_cdf`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from relif_ray.errors import UserError

if TYPE_CHECKING:
    from torch import Tensor

SQUASH_EPS = 1e-6
"""The squash's guard against q90 = q10 (paper appendix A)."""
SQUASH_FORMULA = "clip((s - q10)/(q90 - q10 + 1e-6), 0, 1)"
"""`squash` as reports print it."""
ECDF_FORMULA = "#{same-seed ERM validation scores <= s} / n"
"""`empirical_cdf` as reports print it."""

ScoreValues = TypeVar("ScoreValues", np.ndarray, "Tensor")


def squash(raw: ScoreValues, low: ScoreValues | float, high: ScoreValues | float) -> ScoreValues:
    """The squash of the module docstring, with (low, high) = the reference's (q10, q90).

    Works on numpy arrays and torch tensors alike (both have `.clip`); `low` and `high`
    broadcast against `raw`."""
    return normalised_score(raw, low, high).clip(0.0, 1.0)


def normalised_score(
    raw: ScoreValues, low: ScoreValues | float, high: ScoreValues | float
) -> ScoreValues:
    """u: the squash's affine map before its clip (`squash` is u clipped to [0, 1]), so ERM's
    q10 and q90 lie at u = 0 and u = 1. ReLiF's own variants (`relif_ray.relif.regularizer`:
    the logistic surrogate score, the clip-share penalty) train on it where the clip is flat."""
    return (raw - low) / (high - low + SQUASH_EPS)


def empirical_cdf(raw: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Interface (c): F(s) = #{r in reference : r <= s} / n for the SORTED reference scores,
    in float64 (values k / n, k = 0..n; a NaN score stays NaN)."""
    values = np.asarray(raw, dtype=np.float64)
    ranks = np.searchsorted(reference, values, side="right") / reference.size
    return np.where(np.isnan(values), np.nan, ranks)


@dataclass(frozen=True)
class AuditInterface:
    """How the audit maps a raw, non-probability score into [0, 1] with the same-seed ERM
    reference's valid validation raw scores (module docstring).

    quantiles: (low, high) of the reference scores a squash maps to 0 and 1; None for the
    empirical CDF. summary: what reports say it is."""

    name: str
    quantiles: tuple[float, float] | None
    summary: str

    def constants(self, reference_scores: Sequence[float] | np.ndarray) -> np.ndarray:
        """What the interface keeps of the reference's scores: [low, high] (numpy's linear
        interpolation, float64) for a squash, all of them sorted for the empirical CDF."""
        values = np.asarray(reference_scores, dtype=np.float64)
        if values.size == 0 or not np.isfinite(values).all():
            raise UserError("squash constants: need at least one finite raw score")
        if self.quantiles is None:
            return np.sort(values)
        return np.quantile(values, self.quantiles)

    def apply(self, raw: np.ndarray, constants: np.ndarray) -> np.ndarray:
        """Raw scores on this interface, given `constants` from `constants()`."""
        if self.quantiles is None:
            return empirical_cdf(raw, constants)
        return squash(np.asarray(raw, dtype=np.float64), constants[0], constants[1])


SQUASH_QUANTILES: tuple[float, float] = (0.1, 0.9)
"""q10 and q90: the paper's squash quantiles (also those of ReLiF's running squash)."""
PAPER_INTERFACE = "q10-q90"
"""The paper's interface (appendix A), the only one training uses."""
AUDIT_INTERFACES: dict[str, AuditInterface] = {
    PAPER_INTERFACE: AuditInterface(
        PAPER_INTERFACE, SQUASH_QUANTILES, f"the paper's squash {SQUASH_FORMULA} (q10/q90)"
    ),
    "q1-q99": AuditInterface(
        "q1-q99", (0.01, 0.99), "the same squash with the wider band q1/q99 instead of q10/q90"
    ),
    "ecdf": AuditInterface("ecdf", None, f"the empirical CDF (rank map) {ECDF_FORMULA}"),
}
"""Audit interface name -> its definition, in the order reports show them: (a), (b), (c)."""


def audit_interface(name: str) -> AuditInterface:
    """The interface called `name`, or a one-line error listing the known ones."""
    if name not in AUDIT_INTERFACES:
        known = ", ".join(AUDIT_INTERFACES)
        raise UserError(f"audit interface {name!r}: must be one of {known}")
    return AUDIT_INTERFACES[name]


def squash_bounds(
    raw_scores: Sequence[float] | np.ndarray, interface: str = PAPER_INTERFACE
) -> list[float]:
    """[low, high] (for the paper's interface [q10, q90]) of valid raw audit scores: the
    squash constants a reference's validation scores define (numpy's linear interpolation, in
    float64)."""
    mapping = audit_interface(interface)
    if mapping.quantiles is None:
        raise UserError(f"audit interface {interface!r} is not a squash: it has no bounds")
    return [float(v) for v in mapping.constants(raw_scores)]
