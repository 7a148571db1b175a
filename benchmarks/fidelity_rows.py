"""The `fidelity` section of `run.py` (only with `--only fidelity`): `fidelity.py`'s rows at its
--quick or full size."""

from __future__ import annotations

from rows import Context, Row


def fidelity_rows(ctx: Context) -> list[Row]:
    import fidelity as module

    size = module.QUICK if ctx.quick else module.FULL
    return module.fidelity_rows(size, ctx.workdir / "fidelity")
