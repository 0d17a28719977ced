"""How a multi-node job's leader pilot starts its member pilots, one way per RMS, and how a
member learns its leader, the job's token and its own node (docs/multinode.md, "Per-node pilots").

Why a way per RMS: each RMS has its own per-node launcher, and each carries a different part of
the caller's world to the process it starts. The token never goes on a command line (any user
of the node can read one); neither does anything of the job.

- Slurm: `srun` gives the step the caller's environment: the token and the leader's address
  travel there (a process's environment is readable by its user and root only).
- OAR: `oarsh` is ssh to the node's OAR sshd; the environment does not cross (only OAR's cpuset
  variables are sent), stdin does: the leader writes one JSON line (leader, token, node) on the
  member's stdin and closes it. ssh joins its arguments into one shell string, run by the job
  user's shell on the node, so each word is quoted (none comes from the job).
- PBS: `pbsdsh` asks the MOM to start the task (tm_spawn): OpenPBS's pbsdsh passes no
  environment of its own (envp NULL), Torque's only TM_STDOUT_PORT, and the task's stdin is not
  the caller's. What every task of the job does have is the job's own secret, `$PBS_JOBCOOKIE`
  (the MOM sets it in each task; tm_init needs it; only the job's user and root can read it).
  The token is HMAC-SHA256(cookie, nonce): the nonce and the leader's address are on the command
  line (neither is a secret), the token is not, and a new nonce makes a new token per leader.

How a member names its node: Slurm `$SLURMD_NODENAME`; PBS the host name (PBS names a node by
its MOM's host name; the node file is on the first node only, so the member cannot look its
index up there); OAR has no per-node variable, so the member is told the node oarsh was given
and checks it is really on it (the name must resolve to an address of this host). The leader
then checks the name is one of the job's other nodes, not yet joined (agent.member_leader).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import select
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent import member_link
from vjob.errors import InputError, UsageError, VjobError

RMS_BUILT = ("slurm", "oar", "pbs")
"""The RMSs whose per-node launcher is built; `per-node` under another is refused."""
COOKIE_ENV = "PBS_JOBCOOKIE"
_PBS_LABEL = b"vjob-member-token|"
_NONCE = re.compile(r"[0-9a-f]{32}")
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,62}")
STDIN_TIMEOUT_S = 30.0
"""How long an oarsh-started member waits for its leader's line on stdin."""
_STDIN_MAX = 4096


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


def check_rms(rms: str) -> None:
    if rms not in RMS_BUILT:
        raise UsageError(
            f'[agent] multinode_pilots = "per-node": no per-node launcher for rms {rms!r} '
            f'(built: {", ".join(RMS_BUILT)}); use multinode_pilots = "leader"'
        )


def pbs_token(cookie: str, nonce: str) -> str:
    return hmac.new(cookie.encode(), _PBS_LABEL + nonce.encode(), hashlib.sha256).hexdigest()


def _cookie(environ: Mapping[str, str]) -> str:
    cookie = environ.get(COOKIE_ENV, "")
    if not cookie:
        raise VjobError(f"${COOKIE_ENV} is unset: a per-node pilot under PBS runs inside the job (as pbsdsh does)")
    return cookie


def leader_secret(rms: str, environ: Mapping[str, str]) -> Secret:
    check_rms(rms)
    if rms == "pbs":
        nonce = secrets.token_hex(16)
        return Secret(pbs_token(_cookie(environ), nonce), nonce)
    return Secret(member_link.new_token())


def member_command(rms: str, config: str | None) -> list[str]:
    """The member's argv: the leader's own interpreter (its venv) and, where the launcher does
    not pass the environment (oarsh, pbsdsh), its $PYTHONPATH, then this package's CLI."""
    path = os.environ.get("PYTHONPATH", "")
    argv = ["env", f"PYTHONPATH={path}"] if path and rms != "slurm" else []
    argv += [sys.executable, "-m", "vjob.cli"]
    if config:  # oarsh and pbsdsh do not pass $VJOB_CONFIG
        argv += ["--config", config]
    return [*argv, "run", "--member", "--rms", rms]


def node_index(node: str, node_file: Sequence[str]) -> int:
    """PBS's index of `node` (its first line in $PBS_NODEFILE: TM's node list has the file's order)."""
    for i, line in enumerate(node_file):
        if short_name(line) == node:
            return i
    raise InputError(f"node {node}: not in $PBS_NODEFILE")


def short_name(line: str) -> str:
    """A node file's line as a node name: a host name without its domain; an address as it is."""
    name = line.strip()
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return name.split(".")[0]
    return name


def start(
    rms: str, nodes: Sequence[str], address: str, secret: Secret, *, config: str | None = None,
    node_file: Sequence[str] = (),
) -> list[Started]:  # fmt: skip
    """One member on each of `nodes`, by the RMS's launcher; the token reaches it as its RMS allows."""
    check_rms(rms)
    command = member_command(rms, config)
    if rms == "slurm":
        argv = ["srun", "--ntasks-per-node=1", f"--nodes={len(nodes)}", "--relative=1", "--kill-on-bad-exit=0",
                "--overlap", *command]  # fmt: skip
        env = {**os.environ, member_link.TOKEN_ENV: secret.token, member_link.LEADER_ENV: address}
        return [Started(tuple(nodes), _popen(argv, env=env))]
    out: list[Started] = []
    try:
        for node in nodes:
            if not NODE_NAME.fullmatch(node):
                raise InputError(f"node {node[:80]!r}: not a node name")
            if rms == "oar":
                proc = _popen(["oarsh", node, "--", shlex.join(command)], stdin=subprocess.PIPE)
                line = json.dumps({"leader": address, "token": secret.token, "node": node}) + "\n"
                try:
                    assert proc.stdin is not None
                    proc.stdin.write(line.encode())
                    proc.stdin.close()
                except OSError:  # oarsh already gone: seen by the leader's join
                    pass
            else:
                argv = ["pbsdsh", "-n", str(node_index(node, node_file)), "--", *command, "--leader", address,
                        "--nonce", secret.nonce]  # fmt: skip
                proc = _popen(argv)
            out.append(Started((node,), proc))
    except VjobError:
        for s in out:
            s.proc.kill()
        raise
    return out


def _popen(argv: list[str], *, env: Mapping[str, str] | None = None, stdin: int = subprocess.DEVNULL,
           ) -> subprocess.Popen[bytes]:  # fmt: skip
    try:
        return subprocess.Popen(argv, env=env, stdin=stdin, stdout=subprocess.DEVNULL)
    except OSError as exc:
        raise VjobError(f"cannot start the member pilots ({' '.join(argv[:4])} …): {exc}") from None


def calling(
    rms: str, environ: Mapping[str, str], node: str, *, leader: str = "", nonce: str = "", stdin_fd: int = 0
) -> Calling:
    """What a member needs, read the way its RMS's launcher passed it (see the module's docstring).
    `node`: the node name the pilot found the usual way (used under Slurm and PBS)."""
    check_rms(rms)
    if rms == "slurm":
        token, address = environ.get(member_link.TOKEN_ENV, ""), environ.get(member_link.LEADER_ENV, "")
        if not token or not address:
            raise UsageError(f"vjob run --member: started by a multi-node job's first pilot only "
                             f"(${member_link.TOKEN_ENV} and ${member_link.LEADER_ENV} unset)")  # fmt: skip
        return Calling(address, token, node)
    if rms == "pbs":
        if not leader or not _NONCE.fullmatch(nonce):
            raise UsageError("vjob run --member --rms pbs: --leader HOST:PORT and --nonce (32 hex digits) are"
                             " given by the leader's pbsdsh")  # fmt: skip
        return Calling(leader, pbs_token(_cookie(environ), nonce), node)
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
