"""The user's side of the Saline socket: one request, one answer (saline_bew.protocol).

Why a module of its own: `vjob besteffort submit|list|show|cancel|output|stage` run as the
user and need nothing of the root manager but its socket; the errors they print say what to
do (no manager listening, a group-restricted socket, a manager too slow).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from saline_bew import grammar
from saline_bew.protocol import MAX_LINE, close_fds, read_line
from vjob.errors import InputError, VjobError

CLIENT_TIMEOUT_S = 300.0
"""How long a client waits for an answer (a submission waits for OAR)."""


class RemoteError(VjobError):
    """The manager refused or failed a request; carries its exit code (2: the caller's fault)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code if exit_code in (1, 2) else 1


def call(path: Path, request: dict[str, Any], *, timeout_s: float = CLIENT_TIMEOUT_S, fd: int | None = None) -> Any:
    """Send one request to the manager at `path` and return its result (RemoteError if
    refused); `fd` goes with it (SCM_RIGHTS)."""
    result, got = call_fd(path, request, timeout_s=timeout_s, fd=fd)
    close_fds(got)
    return result


def call_fd(
    path: Path, request: dict[str, Any], *, timeout_s: float = CLIENT_TIMEOUT_S, fd: int | None = None
) -> tuple[Any, list[int]]:
    """`call`, and the descriptors the answer brought (`output`: the caller closes them)."""
    line = json.dumps(request).encode() + b"\n"
    if len(line) > MAX_LINE:
        raise InputError(f"request: more than {MAX_LINE} bytes (a shorter COMMAND?)")
    got: list[int] = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout_s)
            conn.connect(str(path))
            try:
                sent = socket.send_fds(conn, [line], [fd]) if fd is not None else 0
                conn.sendall(line[sent:])
            except (BrokenPipeError, ConnectionResetError) as exc:
                cut: OSError | None = exc  # refused on arrival (too many connections): its line says why
            else:
                cut = None
            reply_line = read_line(conn, got)
            if cut is not None and not reply_line:
                raise cut
    except OSError as exc:
        close_fds(got)
        raise _client_error(path, exc, timeout_s) from None
    try:
        return _result(path, reply_line), got
    except BaseException:
        close_fds(got)
        raise


def _client_error(path: Path, exc: OSError, timeout_s: float) -> VjobError:
    if isinstance(exc, FileNotFoundError | ConnectionRefusedError):
        return VjobError(f"{path}: no Saline manager listens there (is 'vjob besteffort manager' running?)")
    if isinstance(exc, PermissionError):
        return VjobError(f"{path}: permission denied (the site may restrict Saline to a group)")
    if isinstance(exc, TimeoutError):
        return VjobError(f"{path}: the Saline manager did not answer within {timeout_s:.0f} s")
    return VjobError(f"{path}: {exc.strerror or exc}")


def _result(path: Path, reply_line: bytes) -> Any:
    try:
        reply = json.loads(reply_line)
    except (ValueError, RecursionError):
        raise VjobError(f"{path}: the manager's answer is not JSON: {grammar.short(reply_line[:80])}") from None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise VjobError(f"{path}: unexpected answer {grammar.short(reply)}")
    if not reply["ok"]:
        raise RemoteError(str(reply.get("error", "refused")), int(reply.get("exit", 1)))
    return reply.get("result")
