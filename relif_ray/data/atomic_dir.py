"""Write a whole directory atomically: build it under a temporary name, then rename it.

A reader never sees a half-written data set: either `out` holds the old (or no) data set, or
the complete new one. The temporary directory sits next to `out` (same file system, so the
rename is atomic) and is removed if writing fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from relif_ray.errors import UserError


@contextlib.contextmanager
def atomic_directory(
    out: str | Path, *, overwrite: bool = False, replaceable: frozenset[str] = frozenset()
) -> Iterator[Path]:
    """Yield a temporary directory that becomes `out` when the block succeeds.

    A non-empty `out` is refused unless `overwrite`; even then only when it holds nothing but
    the names in `replaceable` (the files of the same layout), so a mistyped path cannot delete
    unrelated files. The old directory is removed only once the new one is in place.
    """
    out = Path(out)
    _check_replaceable(out, overwrite, replaceable)
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield temporary
        _check_replaceable(out, overwrite, replaceable)
        if out.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, retired)
            os.replace(temporary, out)
            shutil.rmtree(retired)
        else:
            os.replace(temporary, out)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def _check_replaceable(out: Path, overwrite: bool, replaceable: frozenset[str]) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"{out}: exists and is not a directory")
    entries = {entry.name for entry in out.iterdir()}
    if not entries:
        return
    if not overwrite:
        raise UserError(f"{out}: exists and is not empty (use --force to replace it)")
    if not entries <= replaceable:
        raise UserError(
            f"{out}: holds files other than a data set of this layout; refusing to replace it"
        )
