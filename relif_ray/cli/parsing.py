"""What every command line of the package shares: the parser that turns a bad flag into one
line, the one error printer, number-list flags and the audit flags of `relif audit` and
`relif report`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from relif_ray.audit import AuditSettings
from relif_ray.errors import UserError, finite_number

EXIT_USER_ERROR = 2
"""Exit status of a user mistake found before anything ran."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is a `UserError` (one line, exit 2) instead of usage + exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(message)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows `(default: X)` only where there is a default to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def run_command(prog: str, command: Callable[[], int]) -> int:
    """Run a command line; a user mistake (`UserError`) is the one line `<prog>: error:
    <message>` on stderr and exit status 2, with no traceback."""
    try:
        return command()
    except UserError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR


def parse_floats(text: str, flag: str) -> list[float]:
    """Comma-separated finite numbers (at least one)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise UserError(f"{flag}: expected comma-separated numbers, got '{text}'")
    return [finite_number(part, f"{flag} value") for part in parts]


AUDIT_FLAGS = {
    "pool_size": ("--pool-size", "N_eval per task"),
    "pairs": ("--pairs", "S pairs per task pair"),
    "pair_seed": ("--pair-seed", "pair sampling seed"),
    "eval_seed": ("--eval-seed", "pool sampling seed"),
}
"""The audit settings (`relif_ray.audit.AuditSettings`) as flags: field -> (flag, help)."""


def add_audit_flags(parser: argparse.ArgumentParser) -> None:
    """--pool-size, --pairs, --pair-seed, --eval-seed, with `AuditSettings`' defaults."""
    defaults = AuditSettings()
    for field, (flag, text) in AUDIT_FLAGS.items():
        default = getattr(defaults, field)
        parser.add_argument(flag, type=int, default=default, help=f"{text} ({default})")


def audit_settings(args: argparse.Namespace) -> AuditSettings:
    """The checked audit settings of the flags `add_audit_flags` added."""
    settings = AuditSettings(**{field: getattr(args, field) for field in AUDIT_FLAGS})
    settings.check({field: flag for field, (flag, _) in AUDIT_FLAGS.items()})
    return settings
