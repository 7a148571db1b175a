"""What every command line of the package shares: the parser that turns a bad flag into one
line, the one error printer, number-list flags and the audit flags of `relif audit` and
`relif report`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relif_ray.audit import AuditSettings
from relif_ray.errors import UserError, finite_number
from relif_ray.messages import show_messages

EXIT_USER_ERROR = 2
"""Exit status of a user mistake found before anything ran."""
EXIT_INTERRUPTED = 130
"""Exit status of a command stopped by Ctrl+C outside a sweep's own stop handling: the shell's
128 + SIGINT, as if the signal had ended the process."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is a `UserError` (one line, exit 2) instead of usage + exit.

    Two rules hold for every flag of every parser here, so no flag can forget them: a value
    given as `type=float` must be a finite number (`finite_float`: NaN and infinity are never
    a setting), and a text or path value may not be empty (`given_text`: `--seeds ''` or
    `--storage ''` is a mistake, never "use the default" or "the current folder"). They are
    argparse's own type conversions, registered for `float`, `Path` and no type.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("type", float, finite_float)
        self.register("type", None, given_text)
        self.register("type", Path, lambda text: Path(given_text(text)))

    def add_subparsers(self, **kwargs: Any) -> argparse._SubParsersAction:
        """Sub-commands; the strings after a sub-command's name are its parser's to check."""
        action = super().add_subparsers(**kwargs)
        action.type = str
        return action

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(message)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows `(default: X)` only where there is a default to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def finite_float(text: str) -> float:
    """A flag's value as a finite float (argparse names the flag in the error)."""
    try:
        return finite_number(text, "value")
    except UserError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def given_text(text: str) -> str:
    """A flag's text value; an empty one is an error, not the flag's default."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a value, got {text!r}")
    return text


def run_command(prog: str, command: Callable[[], int]) -> int:
    """Run a command line; the library's messages are its lines (`relif_ray.messages`), a user
    mistake (`UserError`) the one line `<prog>: error: <message>` on stderr and exit status 2,
    with no traceback. Ctrl+C where no sweep handles it (a running sweep stops gracefully and
    says how to resume: `relif_ray.tuning.stop`), e.g. while data are checked or a report is
    drawn, is the one line `<prog>: interrupted` and exit status 130, not Python's
    traceback."""
    show_messages()
    try:
        return command()
    except UserError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def comma_list(text: str, flag: str) -> list[str]:
    """The items of a comma-separated list flag, stripped (empty ones skipped); a list without
    any item is an error, never the flag's default."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise UserError(f"{flag}: expected a comma-separated list, got '{text}'")
    return items


def parse_floats(text: str, flag: str) -> list[float]:
    """Comma-separated finite numbers (at least one)."""
    return [finite_number(part, f"{flag} value") for part in comma_list(text, flag)]


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
