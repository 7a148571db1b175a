"""Name -> method class. Adding a method is one module that decorates its class with `register`."""

from __future__ import annotations

from typing import Any

from relif_ray.config import GradientSource
from relif_ray.errors import UserError
from relif_ray.methods.base import MTLMethod

METHODS: dict[str, type[MTLMethod]] = {}


def register(cls: type[MTLMethod]) -> type[MTLMethod]:
    """Class decorator: make `cls` selectable by `cls.name` in configs and `--methods`."""
    METHODS[cls.name] = cls
    return cls


def build_method(
    name: str,
    task_names: list[str],
    seed: int,
    gradient_source: GradientSource = "parameters",
    **options: Any,
) -> MTLMethod:
    """Instantiate a registered method; unknown names and options, and a gradient source the
    method lacks, are user errors."""
    if name not in METHODS:
        known = ", ".join(sorted(METHODS))
        raise UserError(
            f"method.name: unknown method '{name}'; the implemented methods are: {known}"
        )
    try:
        return METHODS[name](task_names, seed=seed, gradient_source=gradient_source, **options)
    except TypeError as exc:
        raise UserError(f"method.options: invalid options for '{name}': {exc}") from None
