"""The leader's side of per-node pilots: it starts one member pilot per other node and drives
each member's VM through it (`MemberVM`, a provisioning.coordinated handle).

Why the leader starts the members itself (by its RMS's launcher, pilot.members.launch: Slurm
`srun --relative=1`, OAR `oarsh`, PBS `pbsdsh`) rather than the job script or the RMS: only the
leader knows the job's layout (ranks, names, the network), and the token it makes here reaches
its members only (srun's environment, oarsh's stdin, PBS's job cookie; never a command line),
so a member is whoever knows it, and nobody else can drive a VM of the job. A member's failure
does not end the others (`--kill-on-bad-exit=0`, one oarsh/pbsdsh per node): the leader sees it
as a lost member and rolls the cut back.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pilot.members import link as member_link
from pilot.members import workdir as member_workdir
from pilot.members.launch import launcher, member_command
from pilot.members.link import Link, LinkError
from plugins.member_launch import Secret, Started, new_token
from provisioning.vm_types import DriverError, Snapshot
from vjob import log
from vjob.errors import VjobError
from vjob.model import VMState

_log = log.get("pilot")
JOIN_TIMEOUT_S = 180.0
"""How long the leader waits for every member to connect (srun's step start, Python's import)."""
HANDSHAKE_TIMEOUT_S = 10.0
"""How long one connection may take to prove the token (a member answers in milliseconds)."""
MAX_HANDSHAKES = 32
"""Connections handshaken at once; more are closed on arrival (the port is anyone's to reach)."""
STEP_TIMEOUTS_S = {
    "pause": 30.0,
    "unpause": 30.0,
    "state": 30.0,
    "cpu": 30.0,
    "setup": 30.0,
    "boot": 300.0,
    "delete": 120.0,
    "forget": 120.0,
    "remove_network": 60.0,
    "define": 1800.0,
    "workdir": 30.0,
}
"""Per request; a save's and a restore's come from `operation_timeout_s` (copies included)."""
MEMBER_JOB_FIELDS = ("uid", "gid", "user", "home", "cwd", "hostname", "network", "mounts")
"""The job description's fields a member pilot receives (member_job): never env, args, script."""


class MemberVM:
    """The VM of one member pilot, as the leader drives it (over the member's link)."""

    def __init__(
        self, link: Link, name: str, node: str, uri: str, operation_timeout_s: float, fallback: Any = None
    ) -> None:
        """`fallback`: the VM through the leader's driver (provisioning.coordinated.DriverHandle),
        used only once the member is lost, to undo a cut (a paused VM whose pilot died would
        stay frozen); None where the leader cannot reach the node's libvirt."""
        self.link = link
        self.fallback = fallback
        self.name = name
        self.node = node
        self.uri = uri
        self._op_timeout = operation_timeout_s
        self._lock = threading.Lock()
        self.lost = ""

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """One request and its answer; a lost member or a refusal is the driver's DriverError,
        so provisioning.coordinated rolls a cut back as for a local failure."""
        if self.lost:
            raise DriverError(op, self.name, self.node, f"member pilot lost earlier ({self.lost})")
        timeout = STEP_TIMEOUTS_S.get(op, 2 * self._op_timeout + 60)
        with self._lock:
            try:
                self.link.send({"op": op, **fields}, timeout=30.0)
                answer = self.link.recv(timeout)
            except LinkError as exc:
                self.lost = str(exc)
                self.link.close()
                raise DriverError(op, self.name, self.node, f"member pilot lost: {exc}") from None
        if answer.get("ok") is not True:
            raise DriverError(op, self.name, self.node, f"the member refused: {str(answer.get('error'))[:500]}")
        return answer

    # -- provisioning.coordinated.VMHandle ---------------------------------------------------
    def pause(self) -> bool:
        return self.call("pause").get("paused") is True

    def save(self, *, job_id: int | None, bypass_cache: bool) -> Snapshot:
        a = self.call("save", job_id=job_id, bypass_cache=bypass_cache)
        try:
            return Snapshot(
                vm=self.name,
                node=self.node,
                kind=str(a["kind"]),
                memory_path=Path(str(a["memory_path"])),
                overlay_path=Path(str(a["overlay_path"])) if a.get("overlay_path") else None,
                size_bytes=int(a["size_bytes"]),
                sha256=str(a["sha256"]),
                created_at=float(a["created_at"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DriverError("save", self.name, self.node, f"the member's answer lacks {exc}") from None

    def restore(self, *, from_node: str, paused: bool, bypass_cache: bool) -> None:
        if self._fallen_back():
            self.fallback.restore(from_node=from_node, paused=paused, bypass_cache=bypass_cache)
            return
        self.call("restore", from_node=from_node, paused=paused, bypass_cache=bypass_cache)

    def unpause(self) -> None:
        if self._fallen_back():
            self.fallback.unpause()
            return
        self.call("unpause")

    def state(self, node: str | None = None) -> VMState | None:
        if self._fallen_back():
            return self.fallback.state(node)  # type: ignore[no-any-return]
        value = self.call("state", **({"node": node} if node else {})).get("state")
        return None if value is None else VMState(str(value))

    def _fallen_back(self) -> bool:
        """Whether the member is lost and the leader's driver undoes what it left half done."""
        if self.lost and self.fallback is not None:
            _log.warning(
                "member pilot lost: its VM through the leader's driver", vm=self.name, node=self.node, lost=self.lost
            )
            return True
        return False

    # -- what pilot.multinode.JobVMs asks of every member --------------------------------
    def active(self) -> bool:
        return self.state() is VMState.RUNNING

    def leftover(self) -> bool:
        return self.state() is not None

    def define(self, description: dict[str, Any], place_disk: Callable[[], dict[str, Any]] | None = None) -> None:
        """The member builds its VM's job disk and defines it; the job's ssh key travels sealed.

        A member whose node lacks this pilot's working directory (no shared filesystem: it does
        not see the probe left there, pilot.members.workdir) gets the job disk `place_disk` builds
        here and sends (Driver.place_job_disk, the leader mode's code), checked again on arrival."""
        job = member_job(description.get("job") or {})
        net = dict(job.get("network") or {})
        if net.get("ssh_private"):
            net["ssh_private"] = self.link.seal(str(net["ssh_private"]))
            job["network"] = net
        cwd = str(job.get("cwd", ""))
        probe = member_workdir.leave_probe(cwd) if cwd else None
        try:
            seen = self.call("workdir", cwd=cwd, **({"probe": probe.name, "nonce": probe.nonce} if probe else {}))
        finally:
            if probe is not None:
                probe.remove()  # before any job disk is built from the directory
        if seen.get("same") is True:
            self.call("define", **{**description, "job": job})
            return
        why = str(seen.get("why", ""))[:300]
        if place_disk is None:
            raise DriverError("define", self.name, self.node, f"no job disk for the member: {why}")
        _log.info(
            "member lacks the working directory: its job disk built here and sent",
            vm=self.name,
            node=self.node,
            why=why,
        )
        self.call("define", **{**description, "job": job, "disk": place_disk()})

    def boot(self) -> None:
        self.call("boot")

    def delete(self) -> None:
        self.call("delete")

    def forget(self, node: str) -> None:
        self.call("forget", node=node)

    def remove_network(self) -> None:
        self.call("remove_network")

    def cpu(self) -> tuple[float, int] | None:
        try:
            reading = self.call("cpu").get("cpu")
        except DriverError:
            return None
        return (float(reading[0]), int(reading[1])) if isinstance(reading, list) and len(reading) == 2 else None


def member_job(job: dict[str, Any]) -> dict[str, Any]:
    """What a member needs of the job to build its VM, and nothing more: who runs it (uid, gid,
    user, home), where (cwd), the VM's host name and network. Why not the job's environment and
    arguments: only rank 0's VM runs the script, the others never read them, and the link is
    readable by whoever sniffs the nodes' network (docs/security.md) — a user's environment
    often holds tokens. The member's parser still wants both keys: they go empty."""
    out: dict[str, Any] = {k: job[k] for k in MEMBER_JOB_FIELDS if k in job}
    return {**out, "args": [], "env": {}}


class Members:
    """The member pilots of one job: the listener, their launcher processes, one link per node."""

    def __init__(self, nodes: Sequence[str], *, host: str = "", secret: Secret | None = None) -> None:
        """`nodes`: the other nodes, in rank order (rank 1 first); `secret`: the RMS's
        (its launcher's leader_secret), a fresh token by default; `host`: the address to listen
        on and advertise (`[agent] member_address`), else `leader_address` toward rank 1's node."""
        self.nodes = list(nodes)
        self.secret = secret or Secret(new_token())
        self.token = self.secret.token
        ip = ipaddress.ip_address(host or leader_address(self.nodes[0]))
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        try:
            self.listener = socket.create_server((str(ip), 0), family=family, backlog=128)
        except OSError as exc:
            raise VjobError(
                f"the leader cannot listen on {ip} ([agent] member_address, or the route toward "
                f"{self.nodes[0]}): {exc.strerror}"
            ) from None
        port = self.listener.getsockname()[1]
        self.address = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
        self.links: dict[str, Link] = {}
        self.steps: list[Started] = []

    def launch(self, rms: str, *, config: str | None = None, environ: Mapping[str, str] | None = None) -> None:
        """One member per other node, by the RMS's launcher (pilot.members.launch); `environ`:
        the job's environment the launcher reads (default this process's)."""
        command = member_command(rms, config)
        job_env = os.environ if environ is None else environ
        self.steps = launcher(rms).start(self.nodes, self.address, self.secret, command, job_env)
        _log.info("member pilots started", rms=rms, nodes=self.nodes, leader=self.address)

    def _ended(self) -> str:
        """Why a member that has not joined never will: its launcher ended ('' while none did)."""
        for s in self.steps:
            code = s.proc.poll()
            if code is not None and any(n not in self.links for n in s.nodes):
                return f"their launcher ({', '.join(s.nodes)}) ended with {code}"
        return ""

    def join(self, timeout_s: float = JOIN_TIMEOUT_S, *, handshake_s: float | None = None) -> None:
        """Wait until every node's member proved the token; a stranger is refused and waited past.

        Why each connection in a thread of its own, with a deadline for its whole handshake: the
        port is reachable by anyone on the network, and a connection that says nothing (or one
        byte at a time) must not hold up the members behind it. At most MAX_HANDSHAKES are
        handshaken at once; a connection over that is closed at once (a member tries again,
        member_link.connect), so strangers cost a bounded number of threads and descriptors."""
        deadline = time.monotonic() + timeout_s
        handshake_s = HANDSHAKE_TIMEOUT_S if handshake_s is None else handshake_s
        results: queue.Queue[tuple[socket.socket, Link | None, str]] = queue.Queue()
        pending = threading.BoundedSemaphore(MAX_HANDSHAKES)
        inflight: set[socket.socket] = set()
        over = 0

        def handshake(sock: socket.socket) -> None:
            try:
                link, node = member_link.accept(sock, self.token, timeout=handshake_s)
                results.put((sock, link, node))
            except LinkError as exc:
                results.put((sock, None, str(exc)))
            finally:
                inflight.discard(sock)
                pending.release()

        self.listener.settimeout(0.2)
        try:
            while len(self.links) < len(self.nodes):
                self._take(results)
                if len(self.links) == len(self.nodes):
                    break
                left = deadline - time.monotonic()
                ended = self._ended()
                if left <= 0 or ended:
                    missing = [n for n in self.nodes if n not in self.links]
                    why = ended or f"not within {timeout_s:g} s"
                    raise VjobError(f"member pilots on {', '.join(missing)} did not connect: {why}")
                try:
                    sock, _ = self.listener.accept()
                except TimeoutError:
                    continue
                if not pending.acquire(blocking=False):
                    if not over:  # said once: a flood must not flood the job's output too
                        _log.warning(
                            "connections to the leader closed: too many handshakes at once", limit=MAX_HANDSHAKES
                        )
                    over += 1
                    sock.close()
                    continue
                inflight.add(sock)
                threading.Thread(target=handshake, args=(sock,), name="vjob-member-handshake", daemon=True).start()
        finally:
            self.listener.close()  # the token is spent: nobody else can join
            for sock in list(inflight):  # the strangers still talking end now, not at their deadline
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        _log.info("member pilots joined", nodes=self.nodes)

    def _take(self, results: queue.Queue[tuple[socket.socket, Link | None, str]]) -> None:
        """Record the handshakes that ended: a member of a node of the job without one joins."""
        while True:
            try:
                sock, link, node = results.get_nowait()
            except queue.Empty:
                return
            if link is None:
                _log.warning("a connection to the leader refused", error=node)
                sock.close()
            elif node not in self.nodes or node in self.links or len(self.links) == len(self.nodes):
                _log.warning("a member refused: not a node of the job, or its node has one", node=node[:64])
                link.close()
            else:
                self.links[node] = link

    def vms(self, names: Sequence[str], subnet_id: int, driver: Any, operation_timeout_s: float) -> list[MemberVM]:
        """The MemberVM of each other node (rank 1…), each member told its VM and network."""
        from provisioning import coordinated  # heavy: libvirt-python (the driver)

        out = []
        for rank, (node, name) in enumerate(zip(self.nodes, names, strict=True), start=1):
            uri = driver.uri(node)
            fallback = None if reaches_only_here(uri) else coordinated.DriverHandle(driver, name, node)
            vm = MemberVM(self.links[node], name, node, uri, operation_timeout_s, fallback)
            vm.call("setup", rank=rank, vm=name, subnet_id=subnet_id)
            out.append(vm)
        return out

    def close(self, wait_s: float = 15.0) -> None:
        """Release every member (`bye`), then let their step end (ended after `wait_s`)."""
        for link in self.links.values():
            try:
                link.send({"op": "bye"}, timeout=5.0)
            except LinkError:
                pass
            link.close()
        try:
            self.listener.close()
        except OSError:
            pass
        deadline = time.monotonic() + wait_s
        for s in self.steps:
            try:
                s.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                s.proc.terminate()
                try:
                    s.proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    s.proc.kill()
                    s.proc.wait()


def reaches_only_here(uri: str) -> bool:
    """Whether a libvirt URI is a user's session libvirt of this node (`qemu:///session`, no
    host): a user pilot's driver names every node by it, but it reaches this node's only — a
    lost member's VM on another node cannot be undone through it (it waits for the next pilot)."""
    _scheme, _, rest = uri.partition("://")
    return rest.startswith("/session")  # no host between :// and the path: this node's


def leader_address(toward: str) -> str:
    """The address members reach this node by: the source address of its route toward `toward`
    (the first member's node, its name resolved), which the kernel picks on a UDP connect without
    sending anything — the interface the cluster network is on, where the host name may resolve to
    127.0.1.1 or a management address. A name that does not resolve: the host name's address."""
    try:
        targets = socket.getaddrinfo(toward, 9, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        targets = []
    for family, kind, proto, _canon, sockaddr in targets:
        try:
            with socket.socket(family, kind, proto) as udp:
                udp.connect(sockaddr)  # a route lookup: no packet leaves
                return str(udp.getsockname()[0])
        except OSError:
            continue
    try:
        fallback = socket.gethostbyname(socket.gethostname())
    except OSError:
        fallback = "127.0.0.1"
    _log.warning(
        "no route toward the first member node: the leader listens on its host name's address",
        node=toward[:64],
        address=fallback,
    )
    return fallback
