"""The spec of a table (`relif_ray.data.tabular`): what its columns mean.

    tasks      NAME=COLUMN:KIND, KIND binary, multiclass or regression
    groups     COLUMN, or COLUMN:EDGES for a numeric column banded at the edges
    features   the input columns (empty: every column that is not a task or group column and
               not in `drop`; the spec recorded with an experiment names them all)
    drop       columns not to use
    fractions  train, val and test fractions (they sum to 1)
    data_seed  the seed of the split

A spec is read from flags (`parse_task`, `parse_group`), from a YAML file or from a config's
`data.spec` (`TableSpec.from_dict`); a mistake in it is a one-line `UserError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from relif_ray.errors import UserError

KINDS = ("binary", "multiclass", "regression")
"""The task kinds of a table."""
DEFAULT_FRACTIONS = (0.7, 0.15, 0.15)
RESERVED = ("input", "example_id")
"""Batch keys a task cannot be named (`relif_ray.data.splits.Batch`)."""
SPEC_KEYS = ("tasks", "groups", "features", "drop", "fractions", "data_seed", "summary")
"""The keys of a spec (`summary`: what the sweep recorded of the data,
`relif_ray.data.tabular.TableData.summary`)."""


@dataclass(frozen=True)
class TaskColumn:
    """One task: its name, its column and its kind (`KINDS`)."""

    name: str
    column: str
    kind: str


@dataclass(frozen=True)
class GroupColumn:
    """One sensitive attribute: its column and, for a banded numeric column, the inner edges."""

    column: str
    bands: tuple[float, ...] = ()


@dataclass(frozen=True)
class TableSpec:
    """What a table means (module docstring); `features` empty: every other column."""

    tasks: tuple[TaskColumn, ...]
    groups: tuple[GroupColumn, ...] = ()
    features: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    fractions: tuple[float, float, float] = DEFAULT_FRACTIONS
    data_seed: int = 0

    def __post_init__(self) -> None:
        if not self.tasks:
            raise UserError("data spec: tasks: at least one task is needed")
        names = [task.name for task in self.tasks]
        for task in self.tasks:
            if not task.name.replace("_", "").isalnum() or task.name in RESERVED:
                raise UserError(
                    f"data spec: task name '{task.name}' must be a plain word other than "
                    f"{' and '.join(RESERVED)}"
                )
            if task.kind not in KINDS:
                raise UserError(
                    f"data spec: task {task.name}: unknown kind '{task.kind}' "
                    f"(known: {', '.join(KINDS)})"
                )
        if len(set(names)) != len(names):
            raise UserError(f"data spec: tasks: a task name is repeated in {names}")
        if self.features and self.drop:
            raise UserError("data spec: give features or drop, not both")
        fractions = self.fractions
        if len(fractions) != 3 or min(fractions) <= 0 or abs(sum(fractions) - 1.0) > 1e-9:
            raise UserError(
                f"data spec: fractions: need three positive train, val, test fractions "
                f"summing to 1, got {list(fractions)}"
            )
        task_columns = {task.column: task.name for task in self.tasks}
        for role, columns in (
            ("feature", self.features),
            ("group", [group.column for group in self.groups]),
        ):
            for column in columns:
                if column in task_columns:
                    raise UserError(
                        f"data spec: column '{column}' is task {task_columns[column]}'s label "
                        f"and cannot also be a {role}"
                    )
        for group in self.groups:
            if list(group.bands) != sorted(set(group.bands)):
                raise UserError(
                    f"data spec: group {group.column}: band edges must increase, "
                    f"got {list(group.bands)}"
                )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], where: str = "data spec") -> TableSpec:
        """The spec of a dict (a YAML spec file, or `data.spec` of a config): tasks as
        "NAME=COLUMN:KIND" strings or {name, column, kind}; groups as "COLUMN[:EDGES]"
        strings or {column, bands}. An unknown key is an error."""
        if not isinstance(values, Mapping):
            raise UserError(f"{where}: expected a mapping of {', '.join(SPEC_KEYS)}")
        unknown = [key for key in values if key not in SPEC_KEYS]
        if unknown:
            raise UserError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(SPEC_KEYS)})")
        try:
            fractions = tuple(float(x) for x in values.get("fractions", DEFAULT_FRACTIONS))
            data_seed = int(values.get("data_seed", 0))
        except (TypeError, ValueError):
            raise UserError(
                f"{where}: fractions must be numbers and data_seed an integer"
            ) from None
        return cls(
            tasks=tuple(_task(item, where) for item in _items(values, "tasks", where)),
            groups=tuple(_group(item, where) for item in _items(values, "groups", where)),
            features=tuple(str(c) for c in _items(values, "features", where)),
            drop=tuple(str(c) for c in _items(values, "drop", where)),
            fractions=fractions,  # type: ignore[arg-type]
            data_seed=data_seed,
        )

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain lists and dicts (what a config records; `from_dict` reads it)."""
        values = asdict(self)
        values["fractions"] = list(self.fractions)
        for key in ("tasks", "groups", "features", "drop"):
            values[key] = list(values[key])
        values["groups"] = [{**g, "bands": list(g["bands"])} for g in values["groups"]]
        return values


def _items(values: Mapping[str, Any], key: str, where: str) -> list[Any]:
    found = values.get(key) or []
    if not isinstance(found, list):
        raise UserError(f"{where}: {key} must be a list")
    return found


def parse_task(text: str, where: str = "--task") -> TaskColumn:
    """NAME=COLUMN:KIND."""
    name, equals, rest = text.partition("=")
    column, colon, kind = rest.rpartition(":")
    if not equals or not colon or not name or not column:
        raise UserError(f"{where}: expected NAME=COLUMN:KIND, got '{text}'")
    if kind not in KINDS:
        raise UserError(f"{where} {name}: unknown kind '{kind}' (known: {', '.join(KINDS)})")
    return TaskColumn(name.strip(), column, kind)


def parse_group(text: str, where: str = "--group") -> GroupColumn:
    """COLUMN or COLUMN:EDGES (comma-separated numbers)."""
    column, colon, edges = text.partition(":")
    if not colon:
        return GroupColumn(text)
    try:
        return GroupColumn(column, tuple(float(edge) for edge in edges.split(",")))
    except ValueError:
        raise UserError(f"{where}: expected COLUMN or COLUMN:EDGE,EDGE,..., got '{text}'") from None


def _task(item: Any, where: str) -> TaskColumn:
    if isinstance(item, str):
        return parse_task(item, f"{where}: tasks")
    if isinstance(item, Mapping) and set(item) == {"name", "column", "kind"}:
        return TaskColumn(str(item["name"]), str(item["column"]), str(item["kind"]))
    raise UserError(f"{where}: tasks: expected NAME=COLUMN:KIND or {{name, column, kind}}")


def _group(item: Any, where: str) -> GroupColumn:
    if isinstance(item, str):
        return parse_group(item, f"{where}: groups")
    if isinstance(item, Mapping) and set(item) <= {"column", "bands"} and "column" in item:
        return GroupColumn(str(item["column"]), tuple(float(x) for x in item.get("bands", ())))
    raise UserError(f"{where}: groups: expected COLUMN[:EDGES] or {{column, bands}}")
