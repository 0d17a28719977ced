"""The site configuration the running node service was started with, for operations that read
it (`[guest]` mounts and network, `[node]` limits).

Why a holder and not `vjob.config.load()` in each operation: the service is started with
`vjob --config PATH node-service`, and every operation must see that one file, read once at
start by root, never one named by anything a caller sent.
"""

from __future__ import annotations

from vjob.config import Config, load

_current: Config | None = None


def install(config: Config) -> None:
    """Called once by the service at start (and by tests that run operations directly)."""
    global _current
    _current = config


def config() -> Config:
    """The service's configuration (the default lookup's when none was installed)."""
    global _current
    if _current is None:
        _current = load()
    return _current
