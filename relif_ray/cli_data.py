"""`relif make-data DATASET --out DIR ...`: write a synthetic data set in its real on-disk layout.

Each data set is one entry of `DATA_WRITERS`: a writer function `write(out, *, overwrite,
**options) -> Path` and the options it takes, each exposed as `--name` on the data set's own
sub-command (`relif make-data nyuv2 --help`). Adding a data set is adding an entry.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from relif_ray.data.synthetic_eicu import write_synthetic_eicu
from relif_ray.data.synthetic_mimic3 import write_synthetic_mimic3
from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2


@dataclass(frozen=True)
class WriterOption:
    """One `--name VALUE` option, passed to the writer as the keyword `name`."""

    name: str
    type: Callable[[str], object]
    default: object
    help: str


@dataclass(frozen=True)
class DataWriter:
    """A synthetic data set: its writer function and the options it takes."""

    write: Callable[..., Path]
    help: str
    options: tuple[WriterOption, ...]


DATA_WRITERS: dict[str, DataWriter] = {
    "nyuv2": DataWriter(
        write=write_synthetic_nyuv2,
        help="synthetic rooms in the NYUv2 layout (image, 13-class label, depth, normal)",
        options=(
            WriterOption("train", int, 795, "number of train examples (default 795)"),
            WriterOption("val", int, 654, "number of val examples (default 654)"),
            WriterOption("height", int, 288, "image height in pixels (default 288)"),
            WriterOption("width", int, 384, "image width in pixels (default 384)"),
            WriterOption("seed", int, 0, "random seed; same seed, same bytes (default 0)"),
        ),
    ),
    "mimic3": DataWriter(
        write=write_synthetic_mimic3,
        help="synthetic ICU stays in the MIMIC-III multitask benchmark layout (Harutyunyan et al.)",
        options=(
            WriterOption("patients", int, 1000, "number of patients (default 1000)"),
            WriterOption("seed", int, 0, "random seed; same seed, same bytes (default 0)"),
        ),
    ),
    "eicu": DataWriter(
        write=write_synthetic_eicu,
        help="synthetic ICU stays in the eICU benchmark layout (Sheikhalishahi et al.)",
        options=(
            WriterOption("patients", int, 1000, "number of patients/unit stays (default 1000)"),
            WriterOption("seed", int, 0, "random seed; same seed, same bytes (default 0)"),
        ),
    ),
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `make-data` with one sub-command per entry of `DATA_WRITERS`."""
    parser = subparsers.add_parser(
        "make-data",
        help="write a synthetic data set in the real on-disk layout",
        description="Write a synthetic data set in the real on-disk layout of DATASET.",
    )
    datasets = parser.add_subparsers(dest="dataset", required=True, metavar="DATASET")
    for name, writer in DATA_WRITERS.items():
        dataset_parser = datasets.add_parser(name, help=writer.help, description=writer.help)
        dataset_parser.add_argument(
            "--out", required=True, type=Path, metavar="DIR", help="output directory"
        )
        dataset_parser.add_argument(
            "--force", action="store_true", help="replace an existing non-empty --out"
        )
        for option in writer.options:
            dataset_parser.add_argument(
                f"--{option.name}", type=option.type, default=option.default, help=option.help
            )
        dataset_parser.set_defaults(handler=make_data)


def make_data(args: argparse.Namespace) -> int:
    """Write the data set named by `args.dataset`, print its path and return 0."""
    writer = DATA_WRITERS[args.dataset]
    options = {option.name: getattr(args, option.name) for option in writer.options}
    out = writer.write(args.out, overwrite=args.force, **options)
    print(out)
    return 0
