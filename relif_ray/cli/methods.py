"""`relif methods`: every MTL method a sweep can name, built-in and plug-in, described.

One row per registered method (`relif_ray.methods.methods()`, so the plug-ins of
`RELIF_METHODS_PATH` too): its name, which set it belongs to (the paper's methods, the
default `--methods`; the added built-in ones; plug-ins), its kind, whether `+relif` and the
representation-gradient mode apply, its options with their defaults (as `--set
method.options.NAME=VALUE` takes them) and its citation. Everything is read from the
method classes' descriptions (`relif_ray.methods.base.MTLMethod`), so the listing cannot
drift from what a sweep accepts.
"""

from __future__ import annotations

import argparse
from typing import Any

from relif_ray.errors import install_hint
from relif_ray.methods import MTLMethod, methods
from relif_ray.methods.registry import MTL_EXTRA, missing_requirements, plugin_file
from relif_ray.sweep.labels import PAPER_LABELS, RELIF_LABELS

COLUMNS = ("name", "set", "kind", "+relif", "rep.", "options (default)", "citation")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `methods`."""
    parser = subparsers.add_parser(
        "methods",
        help="list the MTL methods a sweep can name (built-in and RELIF_METHODS_PATH plug-ins)",
        description="List every MTL method: name, set, kind, whether +relif and the "
        "representation-gradient mode apply, options with defaults, citation.",
    )
    parser.set_defaults(handler=list_methods)


def list_methods(args: argparse.Namespace) -> int:
    """Print the method table and its notes; return 0."""
    print("\n".join(method_listing()))
    return 0


def method_listing() -> list[str]:
    """The lines `relif methods` prints: the table, then what its columns mean, the plug-ins'
    files and the methods whose dependencies are missing."""
    registered = methods()
    rows = [method_row(name, registered[name]) for name in listing_order(registered)]
    lines = table([COLUMNS, *rows])
    lines.append("")
    lines.append(
        f"Default --methods: the paper's {','.join(PAPER_LABELS)} (relif = erm+relif); "
        "name others to sweep them, e.g. --methods erm,upgrad,upgrad+relif."
    )
    lines.append(
        "+relif: every method takes ReLiF (<method>+<ReLiF label>, ReLiF labels: "
        f"{', '.join(RELIF_LABELS)}); its gradient is added after the method's aggregation."
    )
    lines.append(
        "rep.: offers method.gradient_source=representation, an approximation "
        "(docs/methods.md). Options: --set method.options.NAME=VALUE."
    )
    for name in sorted(registered):
        if (file := plugin_file(registered[name])) is not None:
            lines.append(f"{name}: plug-in {file}")
        if missing := missing_requirements(registered[name]):
            lines.append(
                f"{name}: needs {', '.join(missing)}, not installed: {install_hint(MTL_EXTRA)}"
            )
    return lines


def listing_order(registered: dict[str, type[MTLMethod]]) -> list[str]:
    """The paper's methods in the paper's order, then the added built-in ones, then the
    plug-ins, each group by name."""
    paper = [name for name in PAPER_LABELS if name in registered]

    def group(name: str) -> tuple[int, str]:
        return (plugin_file(registered[name]) is not None, name)

    return paper + sorted((name for name in registered if name not in paper), key=group)


def method_row(name: str, cls: type[MTLMethod]) -> tuple[str, ...]:
    """One method's cells, in the order of `COLUMNS`."""
    which = "plug-in" if plugin_file(cls) else "paper" if name in PAPER_LABELS else "added"
    options = ", ".join(f"{key}={yaml_text(value)}" for key, value in cls.option_defaults().items())
    representation = "yes" if "representation" in cls.gradient_sources else "-"
    return (name, which, cls.kind, "yes", representation, options or "-", cls.citation)


def yaml_text(value: Any) -> str:
    """A default as `--set` reads it back (YAML scalars: null, true, 0.0001, min)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)
    return str(value)


def table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as left-aligned columns two spaces apart."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
