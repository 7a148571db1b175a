"""The one exception type for user mistakes, and the helpers that keep its messages one line.

Anything a user can get wrong (a flag, a config field, a data file) raises `UserError` with a
one-line message that names the field or file and what is wrong. The command line catches it,
prints `<program>: error: <message>` and exits with status 2 (`relif_ray.cli.errors`); no
traceback is shown.
"""

from __future__ import annotations

import math


class UserError(Exception):
    """Bad input from the user: a one-line, actionable message."""


def install_hint(extra: str) -> str:
    """How to install one of the package's optional extras, as the README installs the package:
    from the repository's checkout (no version is published to a package index)."""
    return f'pip install -e ".[{extra}]" (in the relif-ray checkout)'


def first_line(error: BaseException | str, fallback: str | None = None) -> str:
    """The first line of an exception's message or of a text (what a one-line error quotes of
    a library's error or a tool's output); `fallback`, else an exception's type name, when it
    is empty."""
    lines = str(error).strip().splitlines()
    if lines:
        return lines[0]
    return fallback or ("" if isinstance(error, str) else type(error).__name__)


def last_line(text: str) -> str:
    """The last non-empty line of a text, stripped: of a traceback, the exception itself."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def finite_number(text: str, what: str) -> float:
    """`text` as a finite float, or a one-line `UserError`: "<what> must be a number, got
    '<text>'" (or "must be finite")."""
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{what} must be a number, got '{text}'") from None
    if not math.isfinite(value):
        raise UserError(f"{what} must be finite, got '{text}'")
    return value
