"""Numeric columns of the table readers (`relif_ray.data.eicu`, `relif_ray.data.tabular`): each
reader names the first cell that is not a number in its own words."""

from __future__ import annotations

import numpy as np
import pandas as pd


def as_numbers(cells: pd.Series) -> tuple[pd.Series, int | None]:
    """The cells as float64 (NaN = missing), and the position of the first cell that is neither
    missing nor a finite number (None: there is none)."""
    values = pd.to_numeric(cells, errors="coerce").astype(np.float64)
    bad = np.flatnonzero(((values.isna() & cells.notna()) | np.isinf(values)).to_numpy())
    return values, int(bad[0]) if bad.size else None
