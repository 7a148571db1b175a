"""The command line: every argument parser of the library, and the only library package that
imports `analysis`.

`relif` (the console script, `relif_ray.cli.console`): sweep, make-data, methods,
architectures, audit, report, export. The sweep entry points `sweeps/*.py` call the same front
door as `relif sweep` (`relif_ray.cli.sweep`). User mistakes print one line and exit 2.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """The `relif` console script (`relif_ray.cli.console.main`), imported when called so that
    a sweep entry point does not load the analysis package."""
    from relif_ray.cli.console import main as console_main

    return console_main(argv)
