"""OAR's member launch: `oarsh NODE -- COMMAND` starts one member pilot per other node.

Why the token travels on stdin: oarsh is ssh to the node's OAR sshd; the environment does not
cross (only OAR's cpuset variables are sent), stdin does. The leader writes one JSON line
(leader, token, node) on the member's stdin and closes it. ssh joins its arguments into one
shell string, run by the job user's shell on the node, so each word is quoted (none comes from
the job). OAR has no per-node variable, so the member is told the node oarsh was given and
checks it is really on it (the name must resolve to an address of this host).
"""

from __future__ import annotations

import json
import os
import select
import shlex
import socket
import subprocess
from collections.abc import Mapping, Sequence

from plugins.member_launch import (
    NODE_NAME,
    Calling,
    Secret,
    Started,
    new_token,
    node_file_nodes,
    one_per_node,
    popen,
)
from plugins.oar.adapter import ENVIRONMENT
from vjob.errors import InputError, UsageError

PASSES_ENVIRONMENT = False
"""oarsh passes no environment: $PYTHONPATH and the configuration go on the command."""
STDIN_TIMEOUT_S = 30.0
"""How long an oarsh-started member waits for its leader's line on stdin."""
_STDIN_MAX = 4096


def allocation_nodes(environ: Mapping[str, str]) -> list[str]:
    """The node file's nodes ($OAR_NODEFILE, one line per slot)."""
    return node_file_nodes(ENVIRONMENT, environ)


def leader_secret(environ: Mapping[str, str]) -> Secret:
    return Secret(new_token())


def start(
    nodes: Sequence[str], address: str, secret: Secret, command: Sequence[str], environ: Mapping[str, str]
) -> list[Started]:
    def one(node: str) -> subprocess.Popen[bytes]:
        proc = popen(["oarsh", node, "--", shlex.join(command)], stdin=subprocess.PIPE)
        line = json.dumps({"leader": address, "token": secret.token, "node": node}) + "\n"
        try:
            assert proc.stdin is not None
            proc.stdin.write(line.encode())
            proc.stdin.close()
        except OSError:  # oarsh already gone: seen by the leader's join
            pass
        return proc

    return one_per_node(nodes, one)


def calling(environ: Mapping[str, str], node: str, *, leader: str = "", nonce: str = "", stdin_fd: int = 0) -> Calling:
    """The leader's line on stdin; `node` (the pilot's guess) is not used: OAR names none."""
    msg = _stdin_line(stdin_fd)
    told = msg.get("node")
    if not isinstance(told, str) or not NODE_NAME.fullmatch(told):
        raise InputError(f"stdin node = {str(told)[:80]!r}: not a node name")
    if not is_this_host(told):
        raise InputError(f"stdin node = {told!r}: not an address of this host: oarsh did not start this member there")
    token, address = msg.get("token"), msg.get("leader")
    if not isinstance(token, str) or not isinstance(address, str):
        raise InputError("stdin: the leader's line lacks 'token' or 'leader'")
    return Calling(address, token, told)


def _stdin_line(fd: int) -> dict[str, object]:
    """The leader's one line on stdin (oarsh passes stdin, not the environment)."""
    data = b""
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], STDIN_TIMEOUT_S)
        if not ready:
            raise UsageError(
                f"vjob run --member --rms oar: no line from the leader on stdin within {STDIN_TIMEOUT_S:g} s"
            )
        chunk = os.read(fd, _STDIN_MAX - len(data))
        if not chunk or len(data) + len(chunk) >= _STDIN_MAX:
            raise UsageError("vjob run --member --rms oar: stdin ended or overflowed before the leader's line")
        data += chunk
    try:
        msg = json.loads(data)
    except ValueError:
        raise InputError("stdin: the leader's line is not JSON") from None
    if not isinstance(msg, dict):
        raise InputError("stdin: the leader's line is not a JSON object")
    return msg


def is_this_host(name: str) -> bool:
    """Whether `name` resolves to an address this host owns (only there can a socket bind to it)."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, addr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((addr[0], 0))
            return True
        except OSError:
            continue
    return False
