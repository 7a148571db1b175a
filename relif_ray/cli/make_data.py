"""`relif make-data DATASET --out DIR ...`: write a synthetic data set in its real on-disk layout.

Every registered benchmark (`relif_ray.problems`) brings its synthetic writer and the options
it takes; each option is exposed as `--name` on the benchmark's own sub-command (`relif
make-data nyuv2 --help`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from relif_ray.problems import benchmark, benchmarks


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `make-data` with one sub-command per registered benchmark."""
    parser = subparsers.add_parser(
        "make-data",
        help="write a synthetic data set in the real on-disk layout",
        description="Write a synthetic data set in the real on-disk layout of DATASET.",
    )
    datasets = parser.add_subparsers(dest="dataset", required=True, metavar="DATASET")
    for name, described in benchmarks().items():
        writer = described.synthetic
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
    writer = benchmark(args.dataset, "DATASET").synthetic
    options = {option.name: getattr(args, option.name) for option in writer.options}
    out = writer.write(args.out, overwrite=args.force, **options)
    print(out)
    return 0
