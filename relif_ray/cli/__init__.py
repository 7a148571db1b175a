"""The command line: every argument parser of the library, and the only library package that
imports `analysis`.

`relif` (the console script, `relif_ray.cli.console`): sweep, make-data, methods,
architectures, audit, report, export. The sweep entry points `sweeps/*.py` call the same front
door as `relif sweep` (`relif_ray.cli.sweep`, through `sweep_main`). The package parses and
runs commands; it holds no measurement. User mistakes print one line and exit 2, also those
found while a command's module is imported (a plug-in that does not import: the registries
import the plug-ins with the modules that use them).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    """The `relif` console script (`relif_ray.cli.console.main`), imported when called so that
    a sweep entry point does not load the analysis package."""
    from relif_ray.cli.console import main as console_main

    return console_main(argv)


def sweep_main(**options: Any) -> int:
    """A sweep entry point (`sweeps/*.py`): `relif_ray.cli.sweep.main(**options)` on the
    process's arguments, imported inside the one-line error handling."""
    from relif_ray.cli.parsing import run_command

    def command() -> int:
        from relif_ray.cli.sweep import main as sweep

        return sweep(**options)

    return run_command(Path(sys.argv[0]).name, command)


def tabular_main() -> int:
    """`sweeps/tabular.py`: the sweep on a table (`relif_ray.cli.tabular`) on the process's
    arguments."""
    from relif_ray.cli.parsing import run_command

    def command() -> int:
        from relif_ray.cli.sweep import main as sweep
        from relif_ray.cli.tabular import DATASETS, SOURCE

        return sweep(datasets=DATASETS, controller_checks=None, source=SOURCE)

    return run_command(Path(sys.argv[0]).name, command)
