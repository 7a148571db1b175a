"""The fidelity experiment's goal for ReLiF's own variants whose surrogate sees what the
audit's clip hides (`relif-logistic`, `relif-clipshare`; docs/relif.md), judged over seeds.

Stated before their first run and never loosened (`GOAL`): a variant meets it where, against
the same-seed ERM trial,
- its Bias cut is shown at 95% under every audit interface ((a) q10-q90, (b) q1-q99, (c) ecdf;
  `relif_ray.squash.AUDIT_INTERFACES`) with the interval's upper bound at most 0.5x ERM's
  (the Student-t interval over seeds of the mean log ratio, `compare_ratios`);
- its Worst and its Macro are shown within ±0.02 of ERM's (two one-sided tests at 95%: the
  report's paired verdict "within ±0.02 of ERM");
- its largest clipped share (of depth and normal audit scores at 0 and at 1 under (a)) is at
  most ERM's + 0.05 (the mean over seeds; the fidelity table's clipped-shares row).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relif_ray.analysis.render import bound_text
from relif_ray.analysis.verdicts import VerdictSettings, compare_ratios

GOAL_LABELS = ("relif-logistic", "relif-clipshare")
"""The labels the goal judges: ReLiF's own variants (not the paper's)."""


@dataclass(frozen=True)
class Goal:
    """The goal's bounds: the Bias interval's upper bound (x ERM's) under every interface, the
    equivalence margin of Worst and Macro, and the clipped share's excess over ERM's."""

    bias_upper: float = 0.5
    margin: float = 0.02
    clipped_excess: float = 0.05

    def text(self) -> str:
        return (
            f"Bias cut shown at 95% under (a), (b), (c) with upper bound <= {self.bias_upper:g}x; "
            f"Worst, Macro within ±{self.margin:g} (TOST); clipped <= ERM + "
            f"{self.clipped_excess:g}"
        )


GOAL = Goal()


@dataclass(frozen=True)
class Judged:
    """Whether a variant met the goal, the largest upper bound of its Bias intervals over the
    interfaces (NaN with fewer than two seeds), and what each part showed."""

    met: bool
    largest_upper: float
    detail: str


def judge(
    ratios: dict[str, dict[int, float]],
    utility_verdicts: dict[str, str],
    clipped_excess: float,
    goal: Goal = GOAL,
) -> Judged:
    """The goal on one variant: `ratios`: interface -> seed -> Bias / same-seed ERM Bias;
    `utility_verdicts`: "worst"/"macro" -> the report's paired verdict; `clipped_excess`: the
    largest mean clipped share minus ERM's."""
    settings = VerdictSettings(level=0.95, margin=goal.margin)
    parts, met, uppers = [], True, []
    for interface, per_seed in ratios.items():
        comparison = compare_ratios(np.array(list(per_seed.values())), settings)
        shown = comparison.verdict.startswith("lower than ERM")
        passed = shown and comparison.ci_high <= goal.bias_upper
        met &= passed
        uppers.append(comparison.ci_high)
        parts.append(
            f"{interface} {'pass' if passed else 'FAIL'} ({comparison.estimate:.2f}x, upper "
            f"{bound_text(comparison.ci_high, 1.0, 2)}: {comparison.verdict})"
        )
    for metric, verdict in utility_verdicts.items():
        passed = verdict.startswith(f"within ±{goal.margin:g} of ERM")
        met &= passed
        parts.append(f"{metric} {'pass' if passed else 'FAIL'} ({verdict})")
    passed = clipped_excess <= goal.clipped_excess
    met &= passed
    parts.append(f"clipped {'pass' if passed else 'FAIL'} ({clipped_excess:+.3f} against ERM)")
    largest = float(np.max(uppers)) if uppers else float("nan")  # NaN where one is NaN
    return Judged(bool(met), largest, "; ".join(parts))
