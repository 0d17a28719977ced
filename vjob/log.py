"""Structured logging: readable on a terminal, one JSON object per line otherwise.

Why structlog: every decision must carry the job ids it concerns as fields (`jobs=[...]`), so
that an operator can grep or query the agent's log for one job across observe, decide and act.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def _stderr_logger(*_args: Any) -> structlog.PrintLogger:
    # Looked up at every call: a stream captured once (pytest's capture, a closed pipe) must
    # not outlive its owner, and logs must never go to stdout, which carries JSON output.
    return structlog.PrintLogger(file=sys.stderr)


def configure(level: str = "info", fmt: str = "auto", stream: Any = None) -> None:
    """Set up structlog for the process; `fmt` is auto (tty → console), console or json.

    Logs go to `stream`, or to whatever sys.stderr is at the time of each message.
    """
    probe = stream if stream is not None else sys.stderr
    use_console = fmt == "console" or (fmt == "auto" and hasattr(probe, "isatty") and probe.isatty())
    renderer: Any = structlog.dev.ConsoleRenderer(colors=False) if use_console else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=stream) if stream is not None else _stderr_logger,
        cache_logger_on_first_use=False,
    )


def get(name: str) -> Any:
    """A logger bound to the component `name` (e.g. "agent", "planner"). Lazy: the stream is the
    one standard error is when the logger first logs, not when the module was imported."""
    return structlog.get_logger(component=name)


# Modules log before any CLI has called configure(): send that to stderr too, never stdout.
configure()
