"""Name -> method class. Adding a method is one module that decorates its class with `register`.

The built-in modules are imported with the package; `methods()` also imports the modules in
the directories of `RELIF_METHODS_PATH` (`relif_ray.plugins`), so a plug-in method registers
itself the same way. Every class carries its description (`kind`, `citation`, `requires`,
`gradient_sources`, `option_defaults()`), which `build_method` checks options against; a
method checks the range of its number options with `option_in_range`.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import sys
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Literal

from relif_ray.config import GradientSource
from relif_ray.errors import UserError, first_line, install_hint
from relif_ray.methods.base import MTLMethod
from relif_ray.plugins import METHODS_PATH, import_plugins, plugin_name

METHODS: dict[str, type[MTLMethod]] = {}

BUILT_IN_DIRECTORY = Path(__file__).resolve().parent
"""The directory of the built-in method modules (this package)."""

MTL_EXTRA = "mtl"
"""The install extra that brings every optional dependency of the methods (TorchJD, solvers)."""


def register(cls: type[MTLMethod]) -> type[MTLMethod]:
    """Class decorator: make `cls` selectable by `cls.name` in configs and `--methods`; the
    name must be a plain word (`relif_ray.plugins.plugin_name`)."""
    plugin_name(getattr(cls, "name", None), "method", inspect.getfile(cls))
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
    """The plug-ins of `path_value` (the variable's value: a changed value imports again)."""
    import_plugins(sys.modules[__package__], METHODS_PATH)  # the package is imported first


def plugin_file(cls: type[MTLMethod]) -> Path | None:
    """The module file of a method defined outside this package (a plug-in of
    `RELIF_METHODS_PATH`); None for a built-in method."""
    file = Path(inspect.getfile(cls)).resolve()
    return None if file.parent == BUILT_IN_DIRECTORY else file


def missing_requirements(cls: type[MTLMethod]) -> list[str]:
    """The modules `cls` needs that are not installed."""
    return [module for module in cls.requires if find_spec(module) is None]


def requirement_hint(cls: type[MTLMethod]) -> str:
    """How to install what `cls` misses: our `mtl` extra for a built-in method; a plug-in's
    own requirements are its author's to name."""
    if (file := plugin_file(cls)) is not None:
        return f"install them for the plug-in {file}"
    return install_hint(MTL_EXTRA)


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
            f"{requirement_hint(cls)}"
        )
    for option, value in options.items():
        check_option(f"method.options.{option}", value, accepted[option])
    try:
        return cls(task_names, seed=seed, gradient_source=gradient_source, **options)
    except TypeError as exc:
        raise UserError(f"method.options: invalid options for '{name}': {exc}") from None
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - a plug-in's own failure, said in one line
        if plugin_file(cls) is None:
            raise  # a built-in method's failure is ours to fix: its traceback
        raise UserError(
            f"method.name: {name} (plug-in {plugin_file(cls)}) cannot be built: "
            f"{type(exc).__name__}: {first_line(exc)}"
        ) from None


def check_option(field: str, value: Any, default: Any) -> None:
    """An option value of the kind of its default: a whole number where the default is one, a
    finite number where it is a float, true/false where it is a bool, text where it is text;
    other defaults (None, lists) leave the check to the method, as do the value's range."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise UserError(f"{field}: expected true/false, got {value!r}")
    elif isinstance(default, int):
        if not isinstance(value, int) or isinstance(value, bool):
            raise UserError(f"{field}: expected a whole number, got {value!r}")
    elif isinstance(default, float):
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise UserError(f"{field}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise UserError(f"{field}: must be finite, got {value!r}")
    elif isinstance(default, str) and not isinstance(value, str):
        raise UserError(f"{field}: expected text, got {value!r}")


OptionRange = Literal["finite", ">= 0", "> 0", "[0, 1)"]
OPTION_RANGES: dict[OptionRange, tuple[Callable[[float], bool], str]] = {
    "finite": (lambda value: True, "finite"),
    ">= 0": (lambda value: value >= 0, "a finite number >= 0"),
    "> 0": (lambda value: value > 0, "a finite number > 0"),
    "[0, 1)": (lambda value: 0 <= value < 1, "a number in [0, 1)"),
}
"""The ranges a method's number options take: the rule and how the error says it."""


def option_in_range(option: str, value: float, allowed: OptionRange = "finite") -> float:
    """`value` of `method.options.<option>` as a float, once it is finite and in `allowed`, or
    a one-line `UserError` naming the option: the range check a method's `__init__` makes of
    its number options (a method built directly gets it too; `check_option` checks only that a
    value is of its default's kind)."""
    holds, wording = OPTION_RANGES[allowed]
    if not (math.isfinite(value) and holds(value)):
        raise UserError(f"method.options.{option}: must be {wording}, got {value}")
    return float(value)
