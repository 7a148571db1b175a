"""Plug-in paths: extra directories searched for benchmark and method modules.

A plug-in is a module file in a directory named by an environment variable
(`os.pathsep`-separated): `RELIF_PROBLEMS_PATH` for benchmarks (`relif_ray.problems`),
`RELIF_METHODS_PATH` for MTL methods (`relif_ray.methods`). Each directory is appended to the
package's `__path__`, so a plug-in module is imported as a module of that package and found
exactly like the built-in ones. The sweep passes the variables on to its Ray workers
(`worker_env`), so trial processes find the same plug-ins as the driver.

Both registries import their plug-ins through `import_plugins`, the one place that turns a
plug-in that cannot be used into a one-line `UserError` naming the variable and the file: a
listed directory that does not exist or cannot be read, a module that does not import (a syntax
error, a missing dependency, anything its top level raises) and a module named like a built-in
one (which would be silently hidden by it). What a plug-in registers is checked by its registry
(`plugin_name`: a name that is a plain word, usable in labels, trial names and folders).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
from pathlib import Path
from types import ModuleType

from relif_ray.errors import UserError, first_line

PROBLEMS_PATH = "RELIF_PROBLEMS_PATH"
"""Environment variable: extra directories searched for benchmark modules."""

METHODS_PATH = "RELIF_METHODS_PATH"
"""Environment variable: extra directories searched for MTL method modules."""

PLUGIN_PATHS = (PROBLEMS_PATH, METHODS_PATH)

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
"""What a registered method or benchmark name may be: letters, digits, `_` and `-`, starting
with a letter or digit. It becomes part of method labels (`pcgrad+relif`, so no `+` or `,`),
trial names and Tune's trial folders (so no `/`), and of flags' values."""


def plugin_directories(value: str) -> list[str]:
    """The absolute directories listed in a plug-in path value (empty entries skipped);
    absolute, so Ray trials, which run in their own folders, find them too."""
    return [str(Path(entry).resolve()) for entry in value.split(os.pathsep) if entry]


def import_plugins(package: ModuleType, variable: str) -> list[ModuleType]:
    """Append the directories of the environment variable `variable` to `package.__path__`
    (once each) and import every module in them as a module of `package`; return them. Call
    after the package's built-in modules are imported, so that a plug-in named like one of
    them is recognised (importing its name returns the built-in module)."""
    modules = []
    for directory in plugin_directories(os.environ.get(variable, "")):
        if not Path(directory).is_dir():
            raise UserError(f"{variable}: {directory} is not a directory")
        if not os.access(directory, os.R_OK | os.X_OK):
            raise UserError(f"{variable}: {directory} is not readable")
        if directory not in package.__path__:
            package.__path__.append(directory)
        for module_info in pkgutil.iter_modules([directory]):
            name = module_info.name
            file = Path(directory, name) if module_info.ispkg else Path(directory, f"{name}.py")
            module = _import_plugin(f"{package.__name__}.{name}", file, variable)
            if Path(module.__file__ or "").parent != (file if module_info.ispkg else file.parent):
                raise UserError(
                    f"{variable}: {file} has the name of a built-in module of "
                    f"{package.__name__}; rename it"
                )
            modules.append(module)
    return modules


def _import_plugin(module: str, file: Path, variable: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except UserError:
        raise  # a registry's own one-line error (e.g. a name registered twice)
    except Exception as error:  # noqa: BLE001 - whatever a plug-in's top level raises
        raise UserError(
            f"{variable}: {file} does not import: {type(error).__name__}: {first_line(error)}"
        ) from None


def plugin_name(name: object, kind: str, where: str) -> str:
    """A registered name (`kind`: method, benchmark) as `NAME_PATTERN` allows it; a one-line
    error naming `where` (the module that registers it) otherwise."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise UserError(
            f"{where}: {kind} name {name!r} must be letters, digits, '_' and '-' (it names "
            "labels, trials and folders)"
        )
    return name


def worker_env() -> dict[str, str]:
    """Environment variables a Ray worker needs to find the same plug-ins as this process."""
    env = {}
    for variable in PLUGIN_PATHS:
        directories = plugin_directories(os.environ.get(variable, ""))
        if directories:
            env[variable] = os.pathsep.join(directories)
    return env
