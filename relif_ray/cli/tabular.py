"""`sweeps/tabular.py`: a sweep on any table (the tabular benchmark, `relif_ray.problems.tabular`).

    python sweeps/tabular.py --data FILE --task NAME=COLUMN:KIND [--task ...] \\
        [--group COLUMN[:EDGES] ...] [--feature COLUMN ... | --drop COLUMN ...] [sweep flags]
    python sweeps/tabular.py --spec FILE.yaml [sweep flags]
    python sweeps/tabular.py --preset actg175|support2|compas [sweep flags]

Every other flag is the sweep's (`relif_ray.cli.sweep`). The table is read and checked here,
before anything is written; the spec each trial gets (`data.spec`) names the features used
and holds the data's summary (split sizes, labelled rows, imputed cells), which the experiment
records with every trial's config and `relif report` prints.

A spec file is YAML with the keys of `relif_ray.data.tabular.SPEC_KEYS` (tasks, groups,
features or drop, fractions, data_seed) and `data`, the table's path (relative to the file).
A preset (`PRESETS`) is a spec made for a public table that a package ships
(`relif_ray.data.presets`).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from relif_ray.cli.sweep import data_root
from relif_ray.cli.sweep_flags import DataSource, SourceData
from relif_ray.data import actg175, compas, support2
from relif_ray.data.presets import Preset
from relif_ray.data.synthetic_tabular import DEMO_SPEC, TABLE, synthetic_table
from relif_ray.data.table_spec import SPEC_KEYS, TableSpec, parse_group, parse_task
from relif_ray.data.tabular import TableData, load_table
from relif_ray.errors import UserError, first_line
from relif_ray.experiment.storage import local_path
from relif_ray.problems import DatasetDefaults
from relif_ray.problems.tabular import NAME, table_path

PRESETS: dict[str, Preset] = {
    preset.name: preset for preset in (actg175.PRESET, support2.PRESET, compas.PRESET)
}
"""The presets, by name."""
SPEC_FLAGS = ("task", "group", "feature", "drop")
"""The flags a spec file or a preset replaces."""


def add_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("the table (instead of --data-dir)")
    group.add_argument("--data", metavar="FILE", help="the table: a .csv or .parquet file")
    group.add_argument(
        "--task",
        action="append",
        metavar="NAME=COLUMN:KIND",
        help="a task: KIND binary, multiclass or regression (repeat for each task; the first "
        "stratifies the split)",
    )
    group.add_argument(
        "--group",
        action="append",
        metavar="COLUMN[:EDGES]",
        help="a sensitive attribute of the group audit; EDGES band a numeric column "
        "(age:30,40 gives <30, [30, 40), >=40)",
    )
    group.add_argument(
        "--feature", action="append", metavar="COLUMN",
        help="an input column (default: every column that is not a task, a group or dropped)",
    )  # fmt: skip
    group.add_argument("--drop", action="append", metavar="COLUMN", help="a column not to use")
    group.add_argument(
        "--fractions", metavar="TRAIN,VAL,TEST", help="split fractions (default 0.7,0.15,0.15)"
    )
    group.add_argument("--data-seed", type=int, help="the split's seed (default 0)")
    group.add_argument("--spec", metavar="FILE.yaml", help="the table and its spec in one file")
    group.add_argument(
        "--preset",
        choices=list(PRESETS),
        help="a spec made for a public table: "
        + "; ".join(f"{name} ({preset.source})" for name, preset in PRESETS.items()),
    )


def read_source(args: argparse.Namespace, defaults: DatasetDefaults) -> SourceData:
    """The table's path and `data.spec` (with the data's summary) of the flags; the table is
    read and checked here, and nothing is written."""
    if args.data_dir:
        raise UserError("--data-dir: a table sweep reads --data FILE (or --spec, --preset)")
    given = [f"--{flag}" for flag in SPEC_FLAGS if getattr(args, flag)]
    chosen = [flag for flag, value in (("--spec", args.spec), ("--preset", args.preset)) if value]
    if len(chosen) > 1 or (chosen and given):
        raise UserError(f"{chosen[0]}: conflicts with {(chosen[1:] + given)[0]}")
    if args.preset:
        if args.data:
            raise UserError(f"--preset {args.preset}: conflicts with --data (it reads its own)")
        return preset(args)
    if args.spec:
        values, path = spec_file(args.spec, args.data)
    elif args.data:
        if not args.task:
            raise UserError("--task: at least one NAME=COLUMN:KIND is needed with --data")
        values = {
            "tasks": [asdict(parse_task(text)) for text in args.task],
            "groups": [asdict(parse_group(text)) for text in args.group or []],
            "features": args.feature or [],
            "drop": args.drop or [],
        }
        path = args.data
    elif args.demo:
        if given:
            raise UserError(f"{given[0]}: needs --data FILE (--demo alone uses its own table)")
        root = data_root(args, defaults)
        spec = TableSpec.from_dict(flag_values(args, DEMO_SPEC))
        table = synthetic_table(rows=defaults.demo_data["rows"], seed=0)
        data = load_table(Path(root) / TABLE, spec, table)  # as the trials will read it
        return SourceData(root, recorded(data), demo_data=True)
    else:
        raise UserError("--data FILE with --task, --spec FILE.yaml or --preset is required")
    spec = TableSpec.from_dict(flag_values(args, values), args.spec or "data spec")
    path = str(table_path(Path(path).resolve()))
    data = load_table(path, spec)
    return SourceData(path, recorded(data))


def recorded(data: TableData) -> dict[str, Any]:
    """`data.spec` of a checked table: its spec, features named, and the data's summary."""
    return {**data.spec.to_dict(), "summary": data.summary()}


def flag_values(args: argparse.Namespace, values: dict[str, Any]) -> dict[str, Any]:
    """`values` with --fractions and --data-seed where given."""
    values = dict(values)
    if args.fractions is not None:
        try:
            values["fractions"] = [float(x) for x in args.fractions.split(",")]
        except ValueError:
            raise UserError(
                f"--fractions: expected TRAIN,VAL,TEST, got '{args.fractions}'"
            ) from None
    if args.data_seed is not None:
        values["data_seed"] = args.data_seed
    return values


def spec_file(path: str, data: str | None) -> tuple[dict[str, Any], str]:
    """(the spec, the table's path) of a spec file; --data replaces its `data`."""
    file = Path(path)
    try:
        values = yaml.safe_load(file.read_text())
    except OSError as error:
        raise UserError(f"--spec {path}: not readable: {first_line(error)}") from None
    except yaml.YAMLError as error:
        raise UserError(f"--spec {path}: not YAML: {first_line(error)}") from None
    if not isinstance(values, dict):
        raise UserError(f"--spec {path}: expected a mapping of data, {', '.join(SPEC_KEYS)}")
    values = dict(values)
    table = data or values.pop("data", None)
    values.pop("data", None)
    if not table:
        raise UserError(f"--spec {path}: no data (the table's path), and no --data")
    if unknown := [key for key in values if key not in SPEC_KEYS or key == "summary"]:
        raise UserError(
            f"--spec {path}: unknown key '{unknown[0]}' (known: data, "
            f"{', '.join(key for key in SPEC_KEYS if key != 'summary')})"
        )
    return values, str(file.parent / table) if not data else table


def preset(args: argparse.Namespace) -> SourceData:
    """The preset's table, checked here and written next to the results (as the demo's data)
    once the sweep's every check has passed."""
    results = local_path(args.storage, "--storage")
    if results is None:
        raise UserError(
            f"--preset {args.preset}: writes its table next to the results: use a local --storage"
        )
    chosen = PRESETS[args.preset]
    table = chosen.table()
    folder = results / "data" / chosen.name
    spec = TableSpec.from_dict(flag_values(args, chosen.spec))
    data = load_table(folder / TABLE, spec, table)
    return SourceData(
        str(folder / TABLE), recorded(data), prepare=lambda: chosen.write(folder, table)
    )


SOURCE = DataSource(add=add_flags, read=read_source)
"""The tabular benchmark's data flags."""
DATASETS = (NAME,)
"""The one data set of a table sweep (so it offers no --dataset)."""
