"""A synthetic table for `relif make-data tabular` and `--demo` tabular sweeps.

`table.csv`, one row per patient: numeric features x1-x4 (a few cells missing), a categorical
`site` (a, b, c; a few missing), the groups `sex` (f/m) and `age` (years), and three outcomes
of the features: `event` (binary), `stage` (three classes) and `score` (a number), each with a
few labels missing. `DEMO_SPEC` is what they are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from relif_ray.data.atomic_dir import atomic_directory
from relif_ray.errors import UserError

TABLE = "table.csv"
"""The table's file name in a folder (the tabular benchmark reads a folder's)."""

DEMO_SPEC = {
    "tasks": ["event=event:binary", "stage=stage:multiclass", "score=score:regression"],
    "groups": ["sex", "age:40,60"],
}
"""The spec of the synthetic table."""


def write_synthetic_table(
    out: str | Path, *, rows: int, seed: int, overwrite: bool = False
) -> Path:
    """Write the synthetic table to `out/table.csv` (atomically); return `out`."""
    table = synthetic_table(rows=rows, seed=seed)
    with atomic_directory(out, overwrite=overwrite, replaceable=frozenset({TABLE})) as folder:
        table.to_csv(folder / TABLE, index=False)
    return Path(out)


def synthetic_table(*, rows: int, seed: int) -> pd.DataFrame:
    """The synthetic table (module docstring): a function of (rows, seed) only."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 20:
        raise UserError(f"--rows: need an integer of at least 20, got {rows!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UserError(f"--seed: must be a non-negative integer, got {seed!r}")
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4))
    sex = rng.choice(["f", "m"], size=rows)
    age = np.round(rng.uniform(20, 80, size=rows))
    site = rng.choice(["a", "b", "c"], size=rows).astype(object)
    risk = x[:, 0] - 0.5 * x[:, 1] + 0.4 * (sex == "m") + 0.02 * (age - 50)
    event = (risk + rng.normal(size=rows) > 0.3).astype(float)
    stage = np.digitize(x[:, 2] + 0.5 * x[:, 0] + 0.5 * rng.normal(size=rows), [-0.5, 0.5])
    score = 50 + 10 * x[:, 3] - 5 * x[:, 1] + 3 * rng.normal(size=rows)
    table = pd.DataFrame(
        {
            **{f"x{i + 1}": x[:, i] for i in range(4)},
            "site": site,
            "sex": sex,
            "age": age,
            "event": event,
            "stage": stage.astype(float),
            "score": score,
        }
    )
    for column in ("x2", "site", "event", "stage", "score"):
        table.loc[rng.random(rows) < 0.05, column] = np.nan
    return table
