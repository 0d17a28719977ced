"""The leader's side of per-node pilots: it starts one member pilot per other node and drives
each member's VM through it (`MemberVM`, a provisioning.coordinated handle).

Why the leader starts the members itself (`srun --relative=1`, one task per other node) rather
than the job script or the RMS: only the leader knows the job's layout (ranks, names, the
network), and the token it makes here reaches the members in srun's environment — readable by
the job's user only, never on a command line — so a member is whoever knows it, and nobody
else can drive a VM of the job. A member's failure does not end the others
(`--kill-on-bad-exit=0`): the leader sees it as a lost member and rolls the cut back.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent import member_link
from agent.member_link import Link, LinkError
from provisioning.vm_types import DriverError, Snapshot
from vjob import log
from vjob.errors import VjobError
from vjob.model import VMState

_log = log.get("pilot")
JOIN_TIMEOUT_S = 180.0
"""How long the leader waits for every member to connect (srun's step start, Python's import)."""
STEP_TIMEOUTS_S = {"pause": 30.0, "unpause": 30.0, "state": 30.0, "cpu": 30.0, "setup": 30.0, "boot": 300.0,
                   "delete": 120.0, "forget": 120.0, "remove_network": 60.0, "define": 1800.0}  # fmt: skip
"""Per request; a save's and a restore's come from `operation_timeout_s` (copies included)."""


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
            return Snapshot(vm=self.name, node=self.node, kind=str(a["kind"]), memory_path=Path(str(a["memory_path"])),
                            overlay_path=Path(str(a["overlay_path"])) if a.get("overlay_path") else None,
                            size_bytes=int(a["size_bytes"]), sha256=str(a["sha256"]),
                            created_at=float(a["created_at"]))  # fmt: skip
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
            _log.warning("member pilot lost: its VM through the leader's driver", vm=self.name, node=self.node,
                         lost=self.lost)  # fmt: skip
            return True
        return False

    # -- what agent.pilot_multinode.JobVMs asks of every member --------------------------------
    def active(self) -> bool:
        return self.state() is VMState.RUNNING

    def define(self, description: dict[str, Any]) -> None:
        """The member builds its VM's job disk and defines it; the job's ssh key travels sealed."""
        job = dict(description.get("job") or {})
        net = dict(job.get("network") or {})
        if net.get("ssh_private"):
            net["ssh_private"] = self.link.seal(str(net["ssh_private"]))
            job["network"] = net
        self.call("define", **{**description, "job": job})

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


class Members:
    """The member pilots of one job: the listener, their srun step, one link per node."""

    def __init__(self, nodes: Sequence[str], *, host: str = "") -> None:
        """`nodes`: the other nodes, in rank order (rank 1 first)."""
        self.nodes = list(nodes)
        self.token = member_link.new_token()
        self.listener = socket.create_server((host or _own_address(), 0), backlog=len(self.nodes) + 4)
        self.address = "{}:{}".format(*self.listener.getsockname()[:2])
        self.links: dict[str, Link] = {}
        self.step: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        """What a member needs to find and prove itself to this leader (srun passes it on)."""
        return {member_link.TOKEN_ENV: self.token, member_link.LEADER_ENV: self.address}

    def launch_srun(self, rms: str) -> None:
        """One member per other node of the Slurm allocation, as a step of the job."""
        argv = ["srun", "--ntasks-per-node=1", f"--nodes={len(self.nodes)}", "--relative=1",
                "--kill-on-bad-exit=0", "--overlap", sys.executable, "-m", "vjob.cli", "run", "--member",
                "--rms", rms]  # fmt: skip
        try:
            self.step = subprocess.Popen(argv, env={**os.environ, **self.env()}, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL)  # fmt: skip
        except OSError as exc:
            raise VjobError(f"cannot start the member pilots ({' '.join(argv[:5])} …): {exc}") from None
        _log.info("member pilots started", nodes=self.nodes, leader=self.address)

    def join(self, timeout_s: float = JOIN_TIMEOUT_S) -> None:
        """Wait until every node's member proved the token; a stranger is refused and waited past."""
        deadline = time.monotonic() + timeout_s
        while len(self.links) < len(self.nodes):
            left = deadline - time.monotonic()
            if left <= 0 or (self.step is not None and self.step.poll() is not None):
                missing = [n for n in self.nodes if n not in self.links]
                why = f"their step ended with {self.step.returncode}" if self.step and self.step.poll() is not None \
                    else f"not within {timeout_s:g} s"  # fmt: skip
                raise VjobError(f"member pilots on {', '.join(missing)} did not connect: {why}")
            self.listener.settimeout(min(left, 1.0))
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            try:
                link, node = member_link.accept(sock, self.token, timeout=min(30.0, max(left, 1.0)))
            except LinkError as exc:
                _log.warning("a connection to the leader refused", error=str(exc))
                sock.close()
                continue
            if node not in self.nodes or node in self.links:
                _log.warning("a member refused: not a node of the job, or its node has one", node=node[:64])
                link.close()
                continue
            self.links[node] = link
        self.listener.close()  # the token is spent: nobody else can join
        _log.info("member pilots joined", nodes=self.nodes)

    def vms(self, names: Sequence[str], subnet_id: int, driver: Any, operation_timeout_s: float) -> list[MemberVM]:
        """The MemberVM of each other node (rank 1…), each member told its VM and network."""
        from provisioning import coordinated  # heavy: libvirt-python (the driver)

        out = []
        for rank, (node, name) in enumerate(zip(self.nodes, names, strict=True), start=1):
            fallback = coordinated.DriverHandle(driver, name, node)
            vm = MemberVM(self.links[node], name, node, driver.uri(node), operation_timeout_s, fallback)
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
        if self.step is not None:
            try:
                self.step.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                self.step.terminate()
                try:
                    self.step.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    self.step.kill()


def _own_address() -> str:
    """The address members reach this node by: its host name's, as the cluster resolves it."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
