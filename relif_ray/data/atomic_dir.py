"""Write a whole directory atomically: build it under a temporary name, then rename it.

A reader never sees a half-written data set: either `out` does not exist yet, or it is
complete. The temporary directory sits next to `out` (same file system, so the rename is
atomic) and is removed if writing fails.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from relif_ray.errors import UserError


@contextlib.contextmanager
def atomic_directory(out: str | Path) -> Iterator[Path]:
    """Yield a temporary directory that becomes `out` when the block succeeds.

    `out` must not exist or be an empty directory; a non-empty `out` is a UserError, so
    existing data is never overwritten.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out}: already exists and is not an empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield temporary
        if out.exists():
            out.rmdir()
        temporary.rename(out)
    finally:
        if temporary.exists():
            shutil.rmtree(temporary)
