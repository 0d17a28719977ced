"""The Saline socket's protocol: one JSON object per line each way, both sides' share.

Why apart from the server (saline_bew.server) and the client (saline_bew.client): the
requests' shapes, the line limit, the way descriptors ride with a line (SCM_RIGHTS) and where
the socket is are the contract between `vjob besteffort ...` as a user and the root manager;
each side keeps only its own half of the work.

The requests are validated with pydantic: unknown fields and wrong types are refused with a
message naming the field.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import time
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from saline_bew import grammar
from vjob.errors import InputError

DEFAULT_SOCKET = Path("/run/vjob/saline.sock")
ENV_VAR = "VJOB_SALINE_SOCKET"
MAX_LINE = 256 * 1024
"""Longest request or answer line, in bytes (a COMMAND is at most 64 KiB)."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


Key = Annotated[str, StringConstraints(max_length=64)]
"""Checked against saline_bew.grammar.KEY with re.fullmatch by the handler."""
Word = Annotated[str, StringConstraints(min_length=1, max_length=grammar.MAX_WORD)]


class Submit(_Request):
    op: Literal["submit"]
    image: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    command: Annotated[list[Word], Field(min_length=1, max_length=grammar.MAX_WORDS)]
    vms: Annotated[int, Field(ge=1, le=grammar.MAX_VMS)] = 1
    vcpus: Annotated[int, Field(ge=1, le=grammar.MAX_VCPUS)] = 1
    memory: Annotated[int, Field(ge=1, le=grammar.MAX_MEMORY_MB)] = 128
    walltime: Annotated[str, StringConstraints(max_length=16)] | None = None
    site: Annotated[str, StringConstraints(max_length=64)] | None = None
    user: Annotated[str, StringConstraints(max_length=32)] | None = None


class Admit(_Request):
    """From OAR's admission rule (vjob/deploy_files/oar/vjob_admission_rule.pl, evaluated in
    oarsub as uid `oar`): the user `oarsub`-ed a best-effort vjob; record it and say what the
    submission must become. `command` is OAR's command string, split here into words (shlex,
    never a shell); `walltime_s` is OAR's walltime in seconds (0: the default)."""

    op: Literal["admit"]
    user: Annotated[str, StringConstraints(min_length=1, max_length=32)]
    image: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    command: Annotated[str, StringConstraints(min_length=1, max_length=64 * 1024)]
    vms: Annotated[int, Field(ge=1, le=grammar.MAX_VMS)] = 1
    walltime_s: Annotated[int, Field(ge=0, le=10**8)] = 0
    site: Annotated[str, StringConstraints(min_length=1, max_length=64)]


class ListJobs(_Request):
    op: Literal["list"]


class Show(_Request):
    op: Literal["show"]
    key: Key


class Cancel(_Request):
    op: Literal["cancel"]
    key: Key


class Output(_Request):
    """What COMMAND printed (saline_bew.output): answered with an open read-only descriptor."""

    op: Literal["output"]
    key: Key
    stream: Literal["stdout", "stderr"] = "stdout"


class Stage(_Request):
    """From the holder of an admitted vjob, as the user, in the submission directory: its job
    disk passed with the request (SCM_RIGHTS), or none and `declined` saying why."""

    op: Literal["stage"]
    key: Key
    declined: Annotated[str, StringConstraints(max_length=1000)] = ""


AnyRequest = Submit | Admit | ListJobs | Show | Cancel | Output | Stage
Request = Annotated[AnyRequest, Field(discriminator="op")]
_REQUEST: TypeAdapter[AnyRequest] = TypeAdapter(Request)


def parse_request(line: bytes) -> AnyRequest:
    """One request line, validated; an InputError names the field that is wrong."""
    if len(line) > MAX_LINE:
        raise InputError(f"request: more than {MAX_LINE} bytes")
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        raise InputError(f"request: not a JSON object: {grammar.short(line[:80])}") from None
    try:
        return _REQUEST.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        # pydantic quotes a bad `op` (and an unknown key, in the location) raw: a newline in
        # it split the answer and the log line in two (fuzzed). Escaped and bounded.
        where = _escaped(".".join(str(p) for p in first["loc"])) or "request"
        msg = _escaped(first["msg"])
        raise InputError(f"request: {where}: {msg} (got {grammar.short(first.get('input'))})") from None


def _escaped(text: str, limit: int = 300) -> str:
    """`text` on one line (control characters escaped, as repr() does), at most `limit` long."""
    out = repr(text)[1:-1]
    return out if len(out) <= limit else out[: limit - 3] + "..."


def command_words(command: str) -> list[str]:
    """OAR hands the rule the command as one string: its words (shlex, never a shell)."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise InputError(f"command = {grammar.short(command[:60])}: {exc}") from None
    if not words:
        raise InputError("command: empty (an interactive best-effort job cannot be a vjob)")
    return grammar.command(words)


def walltime(seconds: int) -> str | None:
    """OAR's walltime in seconds → H:MM:SS; 0 → None (saline.default_walltime)."""
    if not seconds:
        return None
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def socket_path(given: str | None, *, configured: str = "") -> Path:
    """--socket, else $VJOB_SALINE_SOCKET, else the configured `saline.socket` (the manager
    reads the configuration; users' commands often cannot), else the default."""
    return Path(given or os.environ.get(ENV_VAR) or configured or DEFAULT_SOCKET)


def read_line(conn: socket.socket, fds: list[int], *, deadline: float | None = None) -> bytes:
    """One request line, and the descriptors passed with it (SCM_RIGHTS; a submission's
    working-directory disk, saline_bew.workdir): read with recvmsg, as a buffered reader
    would drop them. With `deadline` (time.monotonic()) the whole line must arrive by then
    (TimeoutError otherwise)."""
    line = b""
    while not line.endswith(b"\n") and len(line) <= MAX_LINE:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no whole request line before the deadline")
            conn.settimeout(left)
        data, got, _flags, _addr = socket.recv_fds(conn, MAX_LINE + 1 - len(line), 2)
        fds.extend(got)
        if not data:
            break
        line += data
    return line


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
