"""The fixed-delta audit (paper Algorithm 1): the sampled gaps, Bias and VR at a fixed delta.

How delta_ref is chosen and the threshold-drift diagnostics (appendix B: the reference-pair
distances, induced thresholds, drift budget, Theorems B.2 and B.3) are
`relif_ray.audit_thresholds`'s; they sample the same pairs through `sample_pairs`.

Input: one row per (task, example) with the audit score p_k(x) in [0, 1]; columns `task`,
`score`, optionally `example_id`, `valid` (rows with valid == False are ignored) and `split`
(at most one distinct value: never mix splits in one audit).

Sampling (Algorithm 1), made independent of row order, of task order and of the other tasks:
- Pools: each task's valid rows, ordered by example_id when present (else row order); N_eval
  of them drawn without replacement, or all of them when the task has at most N_eval. The
  draw uses its own RNG stream seeded by (eval_seed, task name).
- Pairs: for each unordered task pair {a, b}, named "a|b" with a < b as strings, S index pairs
  drawn uniformly WITH replacement from the two pools, from a stream seeded by
  (pair_seed, a, b). Adding, removing or reordering other tasks changes nothing for {a, b}.
- Bias_ab = mean (|p_a(x) - p_b(y)| - delta_ab)_+, VR_ab = mean 1[|p_a(x) - p_b(y)| > delta_ab];
  the aggregate is the unweighted mean over task pairs. Every task pair has S draws, so this is
  also the mean over all sampled tuples, i.e. the theory's weights are w_ab = 1 / #pairs.

`audit_gaps` returns the sampled gaps so that many deltas cost one sort each (`bias_curve`).
Everything is vectorised numpy; nothing here needs torch.
"""

from __future__ import annotations

import hashlib
import itertools
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from relif_ray.errors import UserError

PairKey = str
"""A task pair "a|b" with a < b."""

Delta = float | Mapping[tuple[str, str] | str, float]


@dataclass(frozen=True)
class PairAudit:
    """Bias and VR of one task pair over its n sampled pairs."""

    bias: float
    vr: float
    n: int


@dataclass(frozen=True)
class AuditResult:
    """Aggregate Bias and VR (mean over task pairs) and the per-pair values."""

    bias: float
    vr: float
    pairs: dict[PairKey, PairAudit]

    def to_dict(self) -> dict:
        """The JSON shape of `relif audit --json`."""
        return {
            "bias": self.bias,
            "vr": self.vr,
            "pairs": {k: {"bias": p.bias, "vr": p.vr, "n": p.n} for k, p in self.pairs.items()},
        }


@dataclass(frozen=True)
class AuditGaps:
    """The sampled absolute gaps |p_a(x) - p_b(y)| of every task pair, reusable for any delta."""

    gaps: dict[PairKey, np.ndarray]

    def audit(self, delta: Delta) -> AuditResult:
        """Bias and VR at `delta` (one value, or one per task pair)."""
        deltas = resolve_delta(delta, list(self.gaps))
        pairs = {
            key: PairAudit(
                bias=float(np.maximum(gaps - deltas[key], 0.0).mean()),
                vr=float((gaps > deltas[key]).mean()),
                n=int(gaps.size),
            )
            for key, gaps in self.gaps.items()
        }
        return AuditResult(
            bias=float(np.mean([p.bias for p in pairs.values()])),
            vr=float(np.mean([p.vr for p in pairs.values()])),
            pairs=pairs,
        )


def pair_key(first: str, second: str) -> PairKey:
    """The canonical name of the unordered task pair {first, second}."""
    a, b = sorted((str(first), str(second)))
    return f"{a}|{b}"


def resolve_delta(delta: Delta, keys: Sequence[PairKey]) -> dict[PairKey, float]:
    """One threshold per task pair from a number or a mapping keyed by (a, b) tuples (either
    order) or "a|b" strings; every value must lie in [0, 1]."""
    if isinstance(delta, Mapping):
        given = {_mapping_key(key): value for key, value in delta.items()}
        missing = [key for key in keys if key not in given]
        if missing:
            raise UserError(f"delta: no threshold for task pair {missing[0]}")
        values = {key: given[key] for key in keys}
    else:
        values = dict.fromkeys(keys, delta)
    return {key: check_delta(value, f"delta for {key}") for key, value in values.items()}


def check_delta(value: object, name: str = "delta") -> float:
    """`value` as a tolerance delta, or a one-line `UserError` naming `name` (a flag, a config
    field): a number in [0, 1], since audit scores and so their gaps lie in [0, 1]. The one
    check of every delta the audit, a sweep's `--delta` and the report's options take."""
    if not (_is_number(value) and 0.0 <= value <= 1.0):
        shown = f"{float(value):g}" if _is_number(value) else repr(value)
        raise UserError(f"{name}: must be in [0, 1], got {shown}")
    return float(value)


def _mapping_key(key: tuple[str, str] | str) -> PairKey:
    names = key if isinstance(key, tuple) else str(key).split("|")
    if len(names) != 2:
        raise UserError(f"delta: task pair key {key!r} must be (a, b) or 'a|b'")
    return pair_key(*names)


def _is_integer(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def scores_frame(
    scores: Mapping[str, Sequence[float] | np.ndarray],
    valid: Mapping[str, Sequence[bool] | np.ndarray] | None = None,
) -> pd.DataFrame:
    """The audit's input table from per-task arrays of audit scores p_k(x) in [0, 1]: one row
    per (task, example), example_id = the position in the task's array, and `valid` (all true
    unless given per task). For own training loops; the engine writes this table itself."""
    parts = []
    for task, values in scores.items():
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        mask = np.ones(values.size, dtype=bool) if valid is None else np.asarray(valid[task])
        parts.append(
            pd.DataFrame(
                {
                    "task": task,
                    "example_id": np.arange(values.size),
                    "score": values,
                    "valid": mask.astype(bool).reshape(-1),
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


def validate_scores(scores: pd.DataFrame, source: str = "scores") -> pd.DataFrame:
    """The usable rows (valid ones), positionally indexed, or a one-line `UserError`."""
    if not isinstance(scores, pd.DataFrame):
        raise UserError(f"{source}: expected a table, got {type(scores).__name__}")
    for column in ("task", "score"):
        if column not in scores.columns:
            raise UserError(f"{source}: missing column '{column}'")
    frame = scores
    if "split" in frame.columns and frame["split"].nunique(dropna=False) > 1:
        names = sorted(map(str, frame["split"].unique()))
        raise UserError(f"{source}: rows from several splits {names}; audit one split at a time")
    if "valid" in frame.columns:
        if not pd.api.types.is_bool_dtype(frame["valid"]):
            raise UserError(f"{source}: column 'valid' must hold true/false values")
        frame = frame[frame["valid"]]
    frame = frame.assign(task=frame["task"].astype(str)).reset_index(drop=True)
    if not pd.api.types.is_numeric_dtype(frame["score"]):
        raise UserError(f"{source}: column 'score' must be numeric")
    values = frame["score"].to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(values) & (values >= 0.0) & (values <= 1.0)))
    if bad.size:
        row = frame.iloc[bad[0]]
        raise UserError(
            f"{source}: score of task {row['task']!r} must be a finite number in [0, 1], "
            f"got {row['score']!r}"
        )
    if any("|" in task for task in frame["task"].unique()):
        raise UserError(f"{source}: task names must not contain '|'")
    if "example_id" in frame.columns and frame.duplicated(["task", "example_id"]).any():
        raise UserError(f"{source}: duplicate (task, example_id) rows")
    if frame["task"].nunique() < 2:
        raise UserError(f"{source}: need valid scores of at least two tasks")
    return frame


def _seed_words(name: str) -> list[int]:
    """Two 32-bit words of a stable hash of a name (Python's hash() is salted per process)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return [int.from_bytes(digest[:4], "little"), int.from_bytes(digest[4:], "little")]


def _rng(seed: int, *names: str) -> np.random.Generator:
    entropy = [seed] + [word for name in names for word in _seed_words(name)]
    return np.random.default_rng(np.random.SeedSequence(entropy))


@dataclass(frozen=True)
class AuditSettings:
    """Algorithm 1's sampling settings: N_eval (`pool_size`), S (`pairs`), `pair_seed` (paper
    Table 7: 256, 4096, 42) and `eval_seed`. The one home of their defaults: the audit
    functions take one as `settings` (default `AuditSettings()`), and `relif audit`,
    `relif report` and `analysis.audit` build one from their flags."""

    pool_size: int = 256
    pairs: int = 4096
    pair_seed: int = 42
    eval_seed: int = 0

    def check(self, names: Mapping[str, str] | None = None) -> None:
        """One-line errors for sizes that are not positive integers and seeds that are not
        non-negative integers; `names` (field -> how the user wrote it, e.g. a flag) name the
        value in the message."""
        names = names or {}
        for field in ("pool_size", "pairs", "pair_seed", "eval_seed"):
            value = getattr(self, field)
            positive = field in ("pool_size", "pairs")
            if not (_is_integer(value) and (value > 0 if positive else value >= 0)):
                need = "a positive integer" if positive else "a non-negative integer"
                raise UserError(f"{names.get(field, field)}: must be {need}, got {value!r}")


def evaluation_pools(
    frame: pd.DataFrame, *, settings: AuditSettings = AuditSettings()
) -> dict[str, np.ndarray]:
    """Row positions of each task's evaluation pool (Algorithm 1 line 1): N_eval
    (`settings.pool_size`) rows drawn with `settings.eval_seed`."""
    size, seed = settings.pool_size, settings.eval_seed
    pools = {}
    for task, rows in frame.groupby("task", sort=True).indices.items():
        if "example_id" in frame.columns:
            rows = rows[np.argsort(frame["example_id"].to_numpy()[rows], kind="stable")]
        if rows.size > size:
            rows = rows[_rng(seed, task).choice(rows.size, size=size, replace=False)]
        pools[task] = rows
    return pools


def sample_pairs(
    frame: pd.DataFrame, *, settings: AuditSettings = AuditSettings()
) -> dict[PairKey, tuple[np.ndarray, np.ndarray]]:
    """Row positions (x of task a, y of task b) of the S sampled pairs of every task pair "a|b"
    (Algorithm 1 line 3); `frame` is the output of `validate_scores`."""
    settings.check()
    pools = evaluation_pools(frame, settings=settings)
    sampled = {}
    for a, b in itertools.combinations(sorted(pools), 2):
        rng = _rng(settings.pair_seed, a, b)
        first = pools[a][rng.integers(0, pools[a].size, size=settings.pairs)]
        second = pools[b][rng.integers(0, pools[b].size, size=settings.pairs)]
        sampled[pair_key(a, b)] = (first, second)
    return sampled


def audit_gaps(
    scores: pd.DataFrame,
    *,
    settings: AuditSettings = AuditSettings(),
) -> AuditGaps:
    """The S sampled gaps of every task pair (Algorithm 1 lines 1-4)."""
    frame = validate_scores(scores)
    values = frame["score"].to_numpy(dtype=np.float64)
    sampled = sample_pairs(frame, settings=settings)
    return AuditGaps({key: np.abs(values[x] - values[y]) for key, (x, y) in sampled.items()})


def fixed_delta_audit(
    scores: pd.DataFrame,
    delta: Delta,
    *,
    settings: AuditSettings = AuditSettings(),
) -> AuditResult:
    """Bias and VR under the held-fixed threshold `delta` (Algorithm 1)."""
    gaps = audit_gaps(scores, settings=settings)
    return gaps.audit(delta)


def bias_curve(gaps: AuditGaps, deltas: Sequence[float] | np.ndarray) -> pd.DataFrame:
    """Aggregate Bias and VR for every delta in `deltas` (one shared threshold each).

    One sort per task pair; each delta then costs a binary search: with gaps sorted ascending,
    Bias(delta) = (sum of gaps above delta - delta * their count) / S.
    """
    grid = np.asarray(deltas, dtype=np.float64)
    if grid.ndim != 1:
        raise UserError("deltas: must be a list of numbers in [0, 1]")
    for value in grid:
        check_delta(float(value), "deltas")
    bias = np.zeros_like(grid)
    vr = np.zeros_like(grid)
    for values in gaps.gaps.values():
        ordered = np.sort(values)
        tail_sums = np.concatenate([np.cumsum(ordered[::-1])[::-1], [0.0]])
        first_above = np.searchsorted(ordered, grid, side="right")
        count_above = ordered.size - first_above
        bias += (tail_sums[first_above] - grid * count_above) / ordered.size
        vr += count_above / ordered.size
    return pd.DataFrame({"delta": grid, "bias": bias / len(gaps.gaps), "vr": vr / len(gaps.gaps)})


__all__ = [
    "AuditGaps",
    "AuditResult",
    "AuditSettings",
    "Delta",
    "PairAudit",
    "PairKey",
    "audit_gaps",
    "bias_curve",
    "check_delta",
    "evaluation_pools",
    "fixed_delta_audit",
    "pair_key",
    "resolve_delta",
    "sample_pairs",
    "scores_frame",
    "validate_scores",
]
