"""What every RMS's member launcher shares: how a multi-node job's leader pilot starts its
member pilots, and how a member learns its leader, the job's token and its own node
(docs/multinode.md, "Per-node pilots").

Why a way per RMS (plugins/<rms>/member_launch.py): each RMS has its own per-node launcher,
and each carries a different part of the caller's world to the process it starts (Slurm's
`srun` the environment, OAR's `oarsh` stdin, PBS's `pbsdsh` only the job's own cookie). The
token never goes on a command line (any user of the node can read one); neither does anything
of the job. Why here and not in the pilot: these are RMS facts, and the pilot (pilot.members
.launch) picks its RMS's module by name, as the agent picks an adapter (plugins.rms_package).

Every RMS module offers the same five names (`MemberLauncher`): whether its launcher passes the
caller's environment, the allocation's nodes, the leader's secret, the start of the members and
what a member learnt from its start. The leader then checks a member's node is one of the job's
other nodes, not yet joined (pilot.members.leader).
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from vjob.errors import InputError, VjobError
from vjob.rms import JobEnvironment

TOKEN_ENV = "VJOB_MEMBER_TOKEN"
"""The environment variable of a member pilot holding the leader's one-time token (hex)."""
LEADER_ENV = "VJOB_MEMBER_LEADER"
"""host:port of the leader's listener, in a member pilot's environment."""
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,62}")


@dataclass(frozen=True)
class Secret:
    """The leader's proof for its members: the token, and under PBS the nonce it comes from."""

    token: str
    nonce: str = ""


@dataclass(frozen=True)
class Calling:
    """What a member learnt from its launch: where its leader is, the token, its node."""

    leader: str
    token: str
    node: str


@dataclass
class Started:
    """One launcher process and the nodes whose member it starts (srun: all; oarsh, pbsdsh: one)."""

    nodes: tuple[str, ...]
    proc: subprocess.Popen[bytes]


class MemberLauncher(Protocol):
    """What a plugins/<rms>/member_launch.py module offers (a module satisfies it by its names)."""

    PASSES_ENVIRONMENT: bool
    """Whether the launcher gives the member the caller's environment (else the member's argv
    carries $PYTHONPATH and the configuration file's path)."""

    def allocation_nodes(self, environ: Mapping[str, str]) -> list[str]:
        """The allocation's node names as the RMS lists them (repeats and order as listed)."""
        ...

    def leader_secret(self, environ: Mapping[str, str]) -> Secret: ...

    def start(
        self, nodes: Sequence[str], address: str, secret: Secret, command: Sequence[str], environ: Mapping[str, str]
    ) -> list[Started]:
        """One member on each of `nodes`, running `command`; the token reaches it as the RMS allows."""
        ...

    def calling(self, environ: Mapping[str, str], node: str, *, leader: str, nonce: str, stdin_fd: int) -> Calling:
        """What a member needs, read the way the launcher passed it; `node`: the name the pilot
        found the usual way."""
        ...


def new_token() -> str:
    """A fresh one-time token (64 hex digits) for a job's members."""
    return secrets.token_hex(32)


def popen(
    argv: list[str], *, env: Mapping[str, str] | None = None, stdin: int = subprocess.DEVNULL
) -> subprocess.Popen[bytes]:
    """A launcher process; its output is not the job's (a member logs through its own pilot)."""
    try:
        return subprocess.Popen(argv, env=env, stdin=stdin, stdout=subprocess.DEVNULL)
    except OSError as exc:
        raise VjobError(f"cannot start the member pilots ({' '.join(argv[:4])} …): {exc}") from None


def one_per_node(nodes: Sequence[str], start_one: Callable[[str], subprocess.Popen[bytes]]) -> list[Started]:
    """One launcher process per node (oarsh, pbsdsh); those started are killed if one cannot be."""
    out: list[Started] = []
    try:
        for node in nodes:
            if not NODE_NAME.fullmatch(node):
                raise InputError(f"node {node[:80]!r}: not a node name")
            out.append(Started((node,), start_one(node)))
    except VjobError:
        for s in out:
            s.proc.kill()
        raise
    return out


def short_name(line: str) -> str:
    """A node file's line as a node name: a host name without its domain; an address as it is."""
    name = line.strip()
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return name.split(".")[0]
    return name


def node_file(env: JobEnvironment, environ: Mapping[str, str]) -> list[str]:
    """The RMS's node file, one line per slot (PBS: line i is TM's node i, pbsdsh -n's index)."""
    var = env.node_list
    try:
        return Path(environ.get(var, "")).read_text().splitlines() if environ.get(var) else []
    except OSError as exc:
        raise InputError(f"${var}: cannot read the node file: {exc.strerror}") from None


def node_file_nodes(env: JobEnvironment, environ: Mapping[str, str]) -> list[str]:
    """The nodes of a node file (PBS, OAR): one short name per non-empty line."""
    return [short_name(line) for line in node_file(env, environ) if line.strip()]
