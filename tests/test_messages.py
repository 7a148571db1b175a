"""The library's log records reach the terminal as plain lines once a command (or a trial
worker) calls `relif_ray.messages.show_messages`: INFO on stdout, warnings on stderr."""

from __future__ import annotations

import contextlib
import io
import logging

from relif_ray.messages import LOGGER, TerminalHandler, show_messages


def test_records_are_lines_on_the_stream_in_use_and_the_setup_is_idempotent():
    show_messages()
    show_messages()
    logger = logging.getLogger(LOGGER)
    assert sum(isinstance(h, TerminalHandler) for h in logger.handlers) == 1
    assert not logger.propagate and logger.level == logging.INFO
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        logging.getLogger("relif_ray.engine").info("train.cuda_graph auto: eager steps, %s", "x")
        logging.getLogger("relif_ray.cuda_graph").warning("the capture failed (%s)", "y")
        logging.getLogger("relif_ray.engine").debug("not shown")
    assert out.getvalue() == "train.cuda_graph auto: eager steps, x\n"
    assert err.getvalue() == "the capture failed (y)\n"
