"""How the library's messages reach a terminal.

The library reports through `logging` (each module's `logging.getLogger(__name__)`, under the
`relif_ray` logger), as Ray and most Python libraries do, and prints nothing itself. A program
that embeds it configures logging as it likes. The commands of this project (`relif ...`, the
sweep scripts) and the processes of their sweeps (Ray Tune's trial workers) call
`show_messages` once: from then on the `relif_ray` logger's records at INFO and above are
plain lines on the current standard output (warnings and errors on standard error), as the
commands have always shown them; a debug record is shown only with `RELIF_DEBUG=1`.
"""

from __future__ import annotations

import logging
import os
import sys

LOGGER = "relif_ray"


class TerminalHandler(logging.Handler):
    """A record's message as one line on the stream in use when it is emitted (so that a
    caller's `contextlib.redirect_stdout` sees it): stdout below WARNING, stderr from it."""

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stdout if record.levelno < logging.WARNING else sys.stderr
        print(self.format(record), file=stream, flush=True)


def show_messages() -> None:
    """Route the library's records to the terminal (module docstring); idempotent."""
    logger = logging.getLogger(LOGGER)
    if any(isinstance(handler, TerminalHandler) for handler in logger.handlers):
        return
    logger.addHandler(TerminalHandler())
    logger.setLevel(logging.DEBUG if os.environ.get("RELIF_DEBUG") == "1" else logging.INFO)
    logger.propagate = False
