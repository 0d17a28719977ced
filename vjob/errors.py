"""The exception hierarchy, carrying the process exit code the CLI turns it into.

Why a hierarchy with exit codes: the CLI promises 2 for bad usage or configuration and 1 for
runtime failures, and every module raising one of these gets that for free.
"""

from __future__ import annotations


class VjobError(Exception):
    """A failure that is explained by its message alone (no traceback needed)."""

    exit_code = 1


class UsageError(VjobError):
    """Bad command-line usage or bad input given by the caller."""

    exit_code = 2


class ConfigError(UsageError):
    """The configuration is invalid: the message names the key, the value and what is allowed."""


class InputError(UsageError):
    """A file or value given to vjob is malformed: the message names where and what."""


class StoreError(VjobError):
    """The state store is unreachable, or at a schema the code cannot use."""


class SchemaOutdatedError(StoreError):
    """The database schema is older than the code expects."""


class SchemaTooNewError(StoreError):
    """The database schema is newer than this version of vjob knows."""


class TransitionError(VjobError):
    """An action was asked of a vjob in a state where it is not allowed."""


class ExhaustedError(VjobError):
    """A finite pool (subnetIDs, vmIDs) has no free element left."""


class CommandError(VjobError):
    """An external command (an RMS client, qemu-img, rsync) failed, hung or printed garbage."""

    def __init__(self, command: list[str] | tuple[str, ...], message: str, *, job: str | None = None) -> None:
        self.command = list(command)
        self.job = job
        where = f" (job {job})" if job else ""
        super().__init__(f"{self.command[0]}{where}: {message}")


class CommandUnavailable(CommandError):
    """The command could not be asked at all (not installed, or no answer within its time):
    unlike a refusal or garbage, this mends by itself, so a caller may retry later."""
