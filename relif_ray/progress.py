"""Progress bars for the slow commands (`relif make-data`, `relif report`, `analysis.load`).

tqdm on stderr, shown only when stderr is a terminal: logs, pipes, CI and Jupyter (whose
stderr is not a terminal) get no bar characters.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from tqdm import tqdm

Item = TypeVar("Item")


def progress(
    items: Iterable[Item], description: str, unit: str = "it", total: int | None = None
) -> Iterable[Item]:
    """`items`, with a progress bar on a terminal (tqdm's `disable=None`: off elsewhere)."""
    return tqdm(items, desc=description, unit=unit, total=total, disable=None, leave=False)
