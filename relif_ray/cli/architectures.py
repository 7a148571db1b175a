"""`relif architectures`: every multi-task architecture `model.architecture` can name.

One row per architecture of `relif_ray.models.architectures.ARCHITECTURES`: its name, the
encoders it applies to (NYUv2's ResNet, the clinical LSTM), its options with their defaults
(as `--set model.architecture_options.NAME=VALUE` takes them), whether the
representation-gradient mode applies, LibMTL's class of the same architecture and its
citation; then what each shares and what its representation is. Everything is read from the
registry, so the listing cannot drift from what a config accepts.
"""

from __future__ import annotations

import argparse

from relif_ray.cli.methods import table, yaml_text
from relif_ray.config import HARD_SHARING
from relif_ray.models.architectures import ARCHITECTURES, Architecture

COLUMNS = ("name", "applies to", "options (default)", "rep.", "LibMTL", "citation")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `architectures`."""
    parser = subparsers.add_parser(
        "architectures",
        help="list the multi-task architectures (model.architecture) and their options",
        description="List every multi-task architecture: the encoders it applies to, options "
        "with defaults, whether the representation-gradient mode applies, LibMTL's class, "
        "citation, shared parameters and representation.",
    )
    parser.set_defaults(handler=list_architectures)


def list_architectures(args: argparse.Namespace) -> int:
    """Print the architecture table and its notes; return 0."""
    print("\n".join(architecture_listing()))
    return 0


def architecture_listing() -> list[str]:
    """The lines `relif architectures` prints."""
    lines = table([COLUMNS, *(architecture_row(arch) for arch in ARCHITECTURES.values())])
    lines += [
        "",
        f"Set with --set model.architecture=NAME (default {HARD_SHARING}); options with --set "
        "model.architecture_options.NAME=VALUE; a sweep over several: --architectures.",
        "applies to: resnet = NYUv2's ResNet encoder, lstm = the clinical LSTM. rep.: "
        "method.gradient_source=representation (one encoder output every head reads).",
        "",
    ]
    lines += table(
        [("name", "shared parameters", "representation")]
        + [(arch.name, arch.shared, arch.representation) for arch in ARCHITECTURES.values()]
    )
    return lines


def architecture_row(arch: Architecture) -> tuple[str, ...]:
    """One architecture's cells, in the order of `COLUMNS`."""
    options = ", ".join(f"{key}={yaml_text(value)}" for key, value in arch.options.items())
    representation = "yes" if arch.name == HARD_SHARING else "-"
    encoders = ", ".join(arch.encoders)
    return (arch.name, encoders, options or "-", representation, arch.libmtl, arch.citation)
