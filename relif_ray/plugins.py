"""Plug-in paths: extra directories searched for benchmark and method modules.

A plug-in is a module file in a directory named by an environment variable
(`os.pathsep`-separated): `RELIF_PROBLEMS_PATH` for benchmarks (`relif_ray.problems`),
`RELIF_METHODS_PATH` for MTL methods (`relif_ray.methods`). Each directory is appended to the
package's `__path__`, so a plug-in module is imported as a module of that package and found
exactly like the built-in ones. The sweep passes the variables on to its Ray workers
(`worker_env`), so trial processes find the same plug-ins as the driver.
"""

from __future__ import annotations

import os
from pathlib import Path

PROBLEMS_PATH = "RELIF_PROBLEMS_PATH"
"""Environment variable: extra directories searched for benchmark modules."""

METHODS_PATH = "RELIF_METHODS_PATH"
"""Environment variable: extra directories searched for MTL method modules."""

PLUGIN_PATHS = (PROBLEMS_PATH, METHODS_PATH)


def plugin_directories(value: str) -> list[str]:
    """The absolute directories listed in a plug-in path value (empty entries skipped);
    absolute, so Ray trials, which run in their own folders, find them too."""
    return [str(Path(entry).resolve()) for entry in value.split(os.pathsep) if entry]


def extend_package_path(package_path: list[str], value: str) -> list[str]:
    """Append the directories of a plug-in path value to a package's `__path__` (once each);
    return them."""
    directories = plugin_directories(value)
    for directory in directories:
        if directory not in package_path:
            package_path.append(directory)
    return directories


def worker_env() -> dict[str, str]:
    """Environment variables a Ray worker needs to find the same plug-ins as this process."""
    env = {}
    for variable in PLUGIN_PATHS:
        directories = plugin_directories(os.environ.get(variable, ""))
        if directories:
            env[variable] = os.pathsep.join(directories)
    return env
