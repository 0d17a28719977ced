"""Subcommands of this package (registered by vjob.cli)."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    """Add this package's subcommands to `sub` (none yet)."""
