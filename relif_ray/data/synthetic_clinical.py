"""What the synthetic clinical writers (MIMIC-III, `relif_ray.data.synthetic_mimic3`; eICU,
`relif_ray.data.synthetic_eicu`) share: their arguments' checks and the folder they write into.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from relif_ray.data.atomic_dir import atomic_directory
from relif_ray.errors import UserError


@contextmanager
def clinical_folder(
    out: str | Path, patients: int, seed: int, overwrite: bool, layout: frozenset[str]
) -> Iterator[tuple[Path, np.random.Generator]]:
    """The folder a writer fills (checked arguments first) and its random generator, seeded
    with `seed`. Written atomically (temporary folder, then rename). A non-empty `out` is
    refused unless `overwrite`, and then replaced only if it holds nothing but the names of
    `layout`."""
    check_synthetic_arguments(patients, seed)
    rng = np.random.default_rng(seed)
    with atomic_directory(out, overwrite=overwrite, replaceable=layout) as folder:
        yield folder, rng


def check_synthetic_arguments(patients: int, seed: int) -> None:
    """--patients and --seed of the clinical synthetic writers (MIMIC-III and eICU)."""
    if isinstance(patients, bool) or not isinstance(patients, int) or patients < 3:
        raise UserError(
            f"--patients: need an integer of at least 3 (one per split), got {patients!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UserError(f"--seed: must be a non-negative integer, got {seed!r}")
