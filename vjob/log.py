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


def configure(level: str = "info", fmt: str = "auto", stream: Any = None) -> None:
    """Set up structlog once per process; `fmt` is auto (tty → console), console or json."""
    stream = stream or sys.stderr
    use_console = fmt == "console" or (fmt == "auto" and hasattr(stream, "isatty") and stream.isatty())
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
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )


def get(name: str) -> Any:
    """A logger bound to the component `name` (e.g. "agent", "planner")."""
    return structlog.get_logger().bind(component=name)
