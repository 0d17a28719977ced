"""PBS's member launch: `pbsdsh -n INDEX` starts one member pilot per other node (tm_spawn).

Why the token comes from the job's cookie: pbsdsh asks the MOM to start the task, and OpenPBS's
pbsdsh passes no environment of its own (envp NULL), Torque's only TM_STDOUT_PORT, and the
task's stdin is not the caller's. What every task of the job does have is the job's own secret,
`$PBS_JOBCOOKIE` (the MOM sets it in each task; tm_init needs it; only the job's user and root
can read it). The token is HMAC-SHA256(cookie, nonce): the nonce and the leader's address are on
the command line (neither is a secret), the token is not, and a new nonce makes a new token per
leader. A member names its node by its host name (PBS names a node by its MOM's host name; the
node file is on the first node only, so the member cannot look its index up there).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import subprocess
from collections.abc import Mapping, Sequence

from plugins.member_launch import Calling, Secret, Started, node_file, node_file_nodes, one_per_node, popen, short_name
from plugins.pbs.adapter import ENVIRONMENT
from vjob.errors import InputError, UsageError, VjobError

PASSES_ENVIRONMENT = False
"""pbsdsh passes nothing of the caller's: $PYTHONPATH and the configuration go on the argv."""
COOKIE_ENV = "PBS_JOBCOOKIE"
_PBS_LABEL = b"vjob-member-token|"
_NONCE = re.compile(r"[0-9a-f]{32}")


def allocation_nodes(environ: Mapping[str, str]) -> list[str]:
    """The node file's nodes ($PBS_NODEFILE, one line per slot)."""
    return node_file_nodes(ENVIRONMENT, environ)


def pbs_token(cookie: str, nonce: str) -> str:
    return hmac.new(cookie.encode(), _PBS_LABEL + nonce.encode(), hashlib.sha256).hexdigest()


def _cookie(environ: Mapping[str, str]) -> str:
    cookie = environ.get(COOKIE_ENV, "")
    if not cookie:
        raise VjobError(f"${COOKIE_ENV} is unset: a per-node pilot under PBS runs inside the job (as pbsdsh does)")
    return cookie


def leader_secret(environ: Mapping[str, str]) -> Secret:
    nonce = secrets.token_hex(16)
    return Secret(pbs_token(_cookie(environ), nonce), nonce)


def node_index(node: str, lines: Sequence[str]) -> int:
    """PBS's index of `node` (its first line in $PBS_NODEFILE: TM's node list has the file's order)."""
    for i, line in enumerate(lines):
        if short_name(line) == node:
            return i
    raise InputError(f"node {node}: not in $PBS_NODEFILE")


def start(
    nodes: Sequence[str], address: str, secret: Secret, command: Sequence[str], environ: Mapping[str, str]
) -> list[Started]:
    lines = node_file(ENVIRONMENT, environ)
    tail = ["--leader", address, "--nonce", secret.nonce]

    def one(node: str) -> subprocess.Popen[bytes]:
        return popen(["pbsdsh", "-n", str(node_index(node, lines)), "--", *command, *tail])

    return one_per_node(nodes, one)


def calling(environ: Mapping[str, str], node: str, *, leader: str = "", nonce: str = "", stdin_fd: int = 0) -> Calling:
    if not leader or not _NONCE.fullmatch(nonce):
        raise UsageError(
            "vjob run --member --rms pbs: --leader HOST:PORT and --nonce (32 hex digits) are"
            " given by the leader's pbsdsh"
        )
    return Calling(leader, pbs_token(_cookie(environ), nonce), node)
