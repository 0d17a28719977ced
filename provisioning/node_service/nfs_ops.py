"""`nfs.up` / `nfs.down`: a job's NFS gateway on a node — one nfs-ganesha process per job,
serving the site's filesystems (`[guest] mounts`) to the job's guests only, as the job's user.

Why a gateway per job, squashing every uid to the job's (docs/security.md, "Guests and the site's
filesystems"): a guest's root is the job's user, so it can claim any uid over `sec=sys`. The
gateway answers it as the job's uid and gid whatever it claims (`Squash = All_Squash`,
Anonymous_Uid/Gid from the RMS's grant, never from the request), only on the job network's
gateway address, only to the job's /24 (`CLIENT { Clients }`): a guest reaches exactly what its
user reaches on the node. Ganesha's VFS backend works with file handles under each export's
path; a symbolic link is returned to the client as a link and resolved in the guest, never
followed by the server.

Choices, measured or tried on this machine (docs/realjobs.md, "Filesystems"):

* NFSv4.1/4.2 only, no rpcbind: a v4 client needs only the server's port; ganesha 4.3 logs
  "Cannot register NFS V4 on TCP" without rpcbind and serves anyway. So several gateways run at
  once, each bound to its own job's gateway address on the same port (NFS_PORT, opened there
  by the job's firewall, provisioning.node_service.net_rules).
* Stopped when the job leaves the node (nfs.down at its end, its requeue or save; the sweep
  when its pilot could not ask), started where it runs again: the gateway address is the same
  on every node, and a guest resumed there reconnects to the new server. Its client state
  (opens, locks) is re-established after the server's grace period (GRACE_S): the new server has
  no record of the client, refuses its reclaims and the client reopens its files by handle
  (NFSv4.1 CLAIM_FH). Kept while the job is away, a gateway would serve no one, hold the export
  open on a node the job left, and could not be checked against the RMS (the job is pending).
* State under STATE_DIR (root's, 0700): per job `vjob-<subnet hex>/` with the configuration,
  pid file, log, recovery directory and a record (whose job, which nodes asked). A service
  restarted finds its gateways there: one still running as recorded is adopted, a dead one
  restarted for a job still running here, a job gone is stopped and its directory removed
  (`sweep`). Processes are stopped by the recorded pid after checking its command line.

Nothing the user controls reaches the configuration: the uid/gid are integers from the RMS,
addresses are computed from the job's subnetID, paths are the operator's (checked by
provisioning.guest_config), pseudo paths are `/vjob/<index>`; the job id is not written at all.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioning import network
from provisioning.guest_config import GuestMount
from provisioning.node_service import site
from provisioning.node_service.grant import Grant, JobAuthority
from provisioning.node_service.net_rules import NFS_PORT
from provisioning.node_service.protocol import OperationSpec
from vjob import log
from vjob.errors import InputError, VjobError

STATE_DIR = Path("/run/vjob/nfs")
GANESHA = "/usr/bin/ganesha.nfsd"
GRACE_S = 15
LEASE_S = 15
"""NFSv4 lease and grace: short, so a guest resumed on a new gateway waits at most ~15 s before
its first write lands (the client renews every lease/3; a few RPCs per minute)."""
START_DEADLINE_S = 30.0
STOP_DEADLINE_S = 10.0
PSEUDO_ROOT = "/vjob"
MAX_ID = 2**31 - 1
_lock = threading.Lock()
_children: dict[int, subprocess.Popen[bytes]] = {}
"""Gateways this process started (waited for when stopped: no zombies); adopted ones are not."""
_log = log.get("node_service")


@dataclass
class Record:
    """Whose gateway a state directory holds, and which of the job's nodes asked for it."""

    rms: str
    job: str
    uid: int
    gid: int
    subnet_id: int
    pid: int = 0
    nodes: list[str] = field(default_factory=list)


def pseudo_path(index: int) -> str:
    return f"{PSEUDO_ROOT}/{index}"


def _check_id(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise InputError(f"{name}: {value!r}: must be an integer in 0..{MAX_ID}")
    return value


def export_config(
    *,
    uid: int,
    gid: int,
    subnet_id: int,
    mounts: Sequence[GuestMount],
    state: Path,
    port: int = NFS_PORT,
    grace_s: int = GRACE_S,
    lease_s: int = LEASE_S,
) -> str:
    """Ganesha's configuration for one job's gateway (pure: tested without a server)."""
    uid, gid = _check_id("uid", uid), _check_id("gid", gid)
    gateway = network.gateway_address(subnet_id)
    clients = ipaddress.IPv4Network(f"{gateway}/24", strict=False)
    lines = [
        "NFS_CORE_PARAM {",
        f"  Protocols = 4; NFS_Port = {int(port)}; Bind_addr = {gateway};",
        "  Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false;",
        "}",
        "NFS_KRB5 { Active_krb5 = false; }",
        "NFSV4 {",
        f"  Grace_Period = {int(grace_s)}; Lease_Lifetime = {int(lease_s)}; Minor_Versions = 1, 2;",
        f'  RecoveryBackend = fs; RecoveryRoot = "{state / "recovery"}";',
        "  Allow_Numeric_Owners = true; Only_Numeric_Owners = true;",
        "}",
        "LOG { Default_Log_Level = WARN; }",
    ]
    for index, mount in enumerate(mounts):
        path = GuestMount.model_validate(mount.model_dump()).source  # checked again: it is written here
        lines += [
            "EXPORT {",
            f'  Export_Id = {index + 1}; Path = "{path}"; Pseudo = "{pseudo_path(index)}";',
            "  Protocols = 4; Transports = TCP; SecType = sys; Access_Type = None;",
            f"  Squash = All_Squash; Anonymous_Uid = {uid}; Anonymous_Gid = {gid}; Manage_Gids = false;",
            f"  CLIENT {{ Clients = {clients}; Access_Type = RW; Protocols = 4; }}",
            "  FSAL { Name = VFS; }",
            "}",
        ]
    return "".join(f"{line}\n" for line in lines)


def answer(subnet_id: int, mounts: Sequence[GuestMount], port: int = NFS_PORT) -> dict[str, Any]:
    """What a pilot puts into job.json's `mounts` (provisioning.guest_agent.mounts reads it)."""
    return {
        "server": str(network.gateway_address(subnet_id)),
        "port": port,
        "exports": [
            {"export": pseudo_path(i), "source": m.source, "target": m.guest_path, "options": list(m.options)}
            for i, m in enumerate(mounts)
        ],
    }


def job_dir(subnet_id: int) -> Path:
    return STATE_DIR / network.bridge_name(subnet_id)


def argv(state: Path) -> list[str]:
    return [
        GANESHA,
        "-F",
        "-L",
        str(state / "ganesha.log"),
        "-f",
        str(state / "ganesha.conf"),
        "-p",
        str(state / "pid"),
    ]


def read_record(state: Path) -> Record | None:
    try:
        data = json.loads((state / "record.json").read_text())
        return Record(
            str(data["rms"]),
            str(data["job"]),
            int(data["uid"]),
            int(data["gid"]),
            int(data["subnet_id"]),
            int(data["pid"]),
            [str(n) for n in data["nodes"]],
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _log.warning("NFS gateway record unreadable: treated as absent", dir=str(state), error=str(exc))
        return None


def _write_record(state: Path, rec: Record) -> None:
    tmp = state / "record.tmp"
    tmp.write_text(json.dumps(rec.__dict__))
    os.replace(tmp, state / "record.json")


def running(pid: int, state: Path) -> bool:
    """Whether `pid` is this job's gateway: alive and running exactly argv(state)."""
    if pid <= 0:
        return False
    child = _children.get(pid)
    if child is not None and child.poll() is not None:
        _children.pop(pid, None)
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return cmdline.split(b"\0")[:-1] == [a.encode() for a in argv(state)]


def _local(address: str) -> bool:
    """Whether `address` is one of this node's (the job's bridge holds it once net.up ran):
    a bind, no packet sent — a connection to an address that is not local would leave the node."""
    with socket.socket() as s:
        try:
            s.bind((address, 0))
            return True
        except OSError:
            return False


def _listening(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=1.0).close()
        return True
    except OSError:
        return False


def _log_tail(state: Path) -> str:
    try:
        lines = (state / "ganesha.log").read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    useful = [ln for ln in lines if ":CRIT :" in ln or ":MAJ :" in ln or ":FATAL :" in ln]
    return " | ".join(ln.split(" : ", 3)[-1] for ln in (useful or lines)[-3:])[:600]


def start(state: Path, rec: Record, mounts: Sequence[GuestMount]) -> int:
    """Write the configuration and start the gateway; its pid once it accepts connections."""
    gateway = str(network.gateway_address(rec.subnet_id))
    if not _local(gateway):
        raise VjobError(
            f"NFS gateway for job {rec.job}: {gateway} is not an address of this node: is the job network up "
            "(net.up first)?"
        )
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    (state / "recovery").mkdir(mode=0o700, exist_ok=True)
    conf = export_config(uid=rec.uid, gid=rec.gid, subnet_id=rec.subnet_id, mounts=mounts, state=state)
    (state / "ganesha.conf").write_text(conf)
    child = subprocess.Popen(
        argv(state),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    _children[child.pid] = child
    rec.pid = child.pid
    _write_record(state, rec)
    deadline = time.monotonic() + START_DEADLINE_S
    while not _listening(gateway, NFS_PORT):
        if child.poll() is not None or time.monotonic() > deadline:
            stop(child.pid, state)
            raise VjobError(f"NFS gateway for job {rec.job} on {gateway}:{NFS_PORT} did not start: {_log_tail(state)}")
        time.sleep(0.2)
    return child.pid


def stop(pid: int, state: Path) -> None:
    """Stop the gateway `pid` when it is this job's (SIGTERM, then SIGKILL)."""
    if not running(pid, state):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_DEADLINE_S
    while running(pid, state) and time.monotonic() < deadline:
        time.sleep(0.1)
    if running(pid, state):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    child = _children.pop(pid, None)
    if child is not None:
        child.wait(timeout=STOP_DEADLINE_S)


def _mounts() -> list[GuestMount]:
    mounts = list(site.config().guest.mounts)
    if not mounts:
        raise InputError("nfs.up: the site declares no filesystems ([guest] mounts is empty)")
    for m in mounts:
        if not os.path.isdir(m.source):
            raise InputError(f"nfs.up: [guest] mounts source {m.source}: no such directory on this node")
    return mounts


def _up(grant: Grant, fields: Mapping[str, Any]) -> dict[str, Any]:
    mounts = _mounts()
    subnet_id = network.pilot_subnet_id(grant.rms, grant.job)
    state = job_dir(subnet_id)
    with _lock:
        STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        rec = read_record(state)
        if rec is not None and (rec.rms, rec.job, rec.uid) != (grant.rms, grant.job, grant.uid):
            raise InputError(
                f"NFS gateway {state.name}: held on this node by {rec.rms} job {rec.job} (its subnetID is this "
                "job's too); it stops when that job ends"
            )
        if rec is None:
            rec = Record(grant.rms, grant.job, grant.uid, grant.gid, subnet_id)
        if grant.node not in rec.nodes:
            rec.nodes.append(grant.node)
        if not running(rec.pid, state):
            start(state, rec, mounts)
        _write_record(state, rec)
    _log.info("NFS gateway up", job=grant.job, node=grant.node, pid=rec.pid, exports=len(mounts))
    return answer(subnet_id, mounts)


def _drop(state: Path, rec: Record, node: str | None) -> bool:
    """Forget `node` (every node when None); stop the gateway and remove its directory when no
    node of the job is left. True when it was removed."""
    rec.nodes = [] if node is None else [n for n in rec.nodes if n != node]
    if rec.nodes:
        _write_record(state, rec)
        return False
    stop(rec.pid, state)
    shutil.rmtree(state, ignore_errors=True)
    return True


def _down(grant: Grant, fields: Mapping[str, Any]) -> dict[str, Any]:
    state = job_dir(network.pilot_subnet_id(grant.rms, grant.job))
    with _lock:
        rec = read_record(state)
        if rec is None or (rec.rms, rec.job, rec.uid) != (grant.rms, grant.job, grant.uid):
            return {"stopped": False}
        stopped = _drop(state, rec, grant.node)
    _log.info("NFS gateway down", job=grant.job, node=grant.node, stopped=stopped)
    return {"stopped": stopped}


OPERATIONS: Mapping[str, OperationSpec] = {
    "nfs.up": OperationSpec(_up, {}, deadline_s=START_DEADLINE_S + STOP_DEADLINE_S + 5),
    "nfs.down": OperationSpec(_down, {}, deadline_s=STOP_DEADLINE_S + 5, after_end=True),
}


def sweep(authority: JobAuthority) -> list[str]:
    """After a restart and on the service's watchdog tick: adopt the gateways of jobs still
    running here, restart a dead one, stop and remove those of jobs gone. Returns what it stopped
    or restarted ("stopped vjob-1a2b", "restarted vjob-1a2b")."""
    done: list[str] = []
    with _lock:
        for state in sorted(STATE_DIR.glob("vjob-*")) if STATE_DIR.is_dir() else []:
            rec = read_record(state)
            if rec is None or job_dir(rec.subnet_id) != state:
                stop_unrecorded(state)
                done.append(f"stopped {state.name}")
                continue
            for node in list(rec.nodes):
                if authority.grant(rec.job, node) is None:
                    rec.nodes.remove(node)
            if not rec.nodes:
                _drop(state, rec, None)
                done.append(f"stopped {state.name}")
            elif not running(rec.pid, state):
                try:
                    start(state, rec, _mounts())
                    done.append(f"restarted {state.name}")
                except VjobError as exc:
                    _log.warning("NFS gateway restart failed", dir=str(state), error=str(exc))
    if done:
        _log.warning("NFS gateways swept", done=done)
    return done


def stop_unrecorded(state: Path) -> None:
    """A directory without a readable record: stop the pid of its pid file when it runs our
    argv for that directory, then remove it."""
    try:
        pid = int((state / "pid").read_text().strip() or 0)
    except (OSError, ValueError):
        pid = 0
    stop(pid, state)
    shutil.rmtree(state, ignore_errors=True)
