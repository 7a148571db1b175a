"""Name -> method class. Adding a method is one module that decorates its class with `register`.

The built-in modules are imported with the package; `methods()` also imports the modules in
the directories of `RELIF_METHODS_PATH` (`relif_ray.plugins`), so a plug-in method registers
itself the same way. Every class carries its description (`kind`, `citation`, `requires`,
`gradient_sources`, `option_defaults()`), which `build_method` checks options against.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import pkgutil
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from relif_ray.config import GradientSource
from relif_ray.errors import UserError, install_hint
from relif_ray.methods.base import MTLMethod
from relif_ray.plugins import METHODS_PATH, extend_package_path

METHODS: dict[str, type[MTLMethod]] = {}

BUILT_IN_DIRECTORY = Path(__file__).resolve().parent
"""The directory of the built-in method modules (this package)."""

MTL_EXTRA = "mtl"
"""The install extra that brings every optional dependency of the methods (TorchJD, solvers)."""


def register(cls: type[MTLMethod]) -> type[MTLMethod]:
    """Class decorator: make `cls` selectable by `cls.name` in configs and `--methods`."""
    existing = METHODS.get(cls.name)
    if existing is not None and existing is not cls:
        raise UserError(
            f"{cls.__module__}: a method '{cls.name}' already exists ({existing.__module__})"
        )
    METHODS[cls.name] = cls
    return cls


def methods() -> dict[str, type[MTLMethod]]:
    """Every registered method: the built-in ones and those on `RELIF_METHODS_PATH`."""
    _import_plugins(os.environ.get(METHODS_PATH, ""))
    return METHODS


@functools.cache
def _import_plugins(path_value: str) -> None:
    package = sys.modules[__package__]  # relif_ray.methods, imported before any of its modules
    for directory in extend_package_path(package.__path__, path_value):
        for module_info in pkgutil.iter_modules([directory]):
            module = importlib.import_module(f"{package.__name__}.{module_info.name}")
            if Path(module.__file__ or "").parent != Path(directory):
                raise UserError(
                    f"{METHODS_PATH}: {directory}/{module_info.name}.py has the name of a "
                    "built-in method module; rename it"
                )


def plugin_file(cls: type[MTLMethod]) -> Path | None:
    """The module file of a method defined outside this package (a plug-in of
    `RELIF_METHODS_PATH`); None for a built-in method."""
    file = Path(inspect.getfile(cls)).resolve()
    return None if file.parent == BUILT_IN_DIRECTORY else file


def missing_requirements(cls: type[MTLMethod]) -> list[str]:
    """The modules `cls` needs that are not installed."""
    return [module for module in cls.requires if find_spec(module) is None]


def build_method(
    name: str,
    task_names: list[str],
    seed: int,
    gradient_source: GradientSource = "parameters",
    **options: Any,
) -> MTLMethod:
    """Instantiate a registered method; unknown names and options, a gradient source the
    method lacks and a missing optional dependency are one-line user errors."""
    registered = methods()
    if name not in registered:
        known = ", ".join(sorted(registered))
        raise UserError(
            f"method.name: unknown method '{name}'; the implemented methods are: {known}"
        )
    cls = registered[name]
    accepted = cls.option_defaults()
    unknown = [option for option in options if option not in accepted]
    if unknown:
        raise UserError(
            f"method.options: {name} takes no option {', '.join(map(repr, unknown))} "
            f"(its options: {', '.join(accepted) or 'none'})"
        )
    if missing := missing_requirements(cls):
        raise UserError(
            f"method.name: {name} needs {', '.join(missing)}, which are not installed: "
            f"{install_hint(MTL_EXTRA)}"
        )
    try:
        return cls(task_names, seed=seed, gradient_source=gradient_source, **options)
    except TypeError as exc:
        raise UserError(f"method.options: invalid options for '{name}': {exc}") from None
