"""A member pilot (`vjob run --member`): the VM of one non-first node of a multi-node job.

Why a pilot per node (docs/multinode.md, "Per-node pilots"): the VM's job disk is built where
the VM runs, the VM is defined and booted on the node's own libvirt, and a process of the job
runs on every node. Why the member obeys its leader rather than acting on its own: a
checkpoint is one cut only if every VM is paused before any is saved, which only the leader
(rank 0's pilot) can see. So a member never saves on its own SIGTERM (Slurm signals every
step of a requeued job at once); it waits for the leader's PAUSE and SAVE. If the leader is
gone, it saves its VM only when the VM is already paused — then the VM is at the cut, and the
job's next pilot finishes that cut (pilot.multinode.JobVMs._finish_cut); a running VM is
left running for the next pilot to adopt.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pilot.members import workdir as member_workdir
from pilot.members.link import Link, LinkError
from pilot.site_network import SiteLink, SiteNic
from pilot.vm import DriverVM
from provisioning import integrity, network, transfer
from provisioning.vm_types import check_name
from vjob import log
from vjob.errors import VjobError

_log = log.get("pilot")
SETUP_TIMEOUT_S = 120.0
"""How long a member waits for its leader's first message after the handshake."""
NODE_FIELDS = ("node", "from_node")

SpecBuilder = Callable[[dict[str, Any], str, int, Path | None], Any]
"""(the leader's `define` message, the VM's name, its rank, the working directory to build the
job disk from — None: the leader sent the disk, it is in place) → the VMSpec. The message also
holds `bridge` (the job's libvirt bridge) and `site_nic` (the VM's tap from the node service, a
pilot.site_network.SiteNic, or None), both put there by the member, never the leader's."""
SiteFactory = Callable[[int], SiteLink]
"""The VM's vmID (rank + 1) → its share of the job's network on this node (pilot.site_network.SiteLink)."""


class Member:
    """One member pilot: serves its leader's requests on its VM until `bye` or the leader is gone."""

    def __init__(
        self,
        link: Link,
        driver: Any,
        node: str,
        build_spec: SpecBuilder,
        workdir: Path | None = None,
        site: SiteFactory | None = None,
    ) -> None:
        """`workdir`: the directory srun started this member in (member_workdir.own_workdir);
        `site`: where the site runs a node service, the VM's tap comes from it (a user's libvirt
        can make no bridge); without one, the job's bridge is made on this node's libvirt."""
        self._site_factory = site
        self.site: SiteLink | None = None
        self.link = link
        self.driver = driver
        self.node = node
        self.build_spec = build_spec
        self.workdir = workdir
        self.same_workdir: tuple[bool, str] = (False, "the leader never showed its working directory")
        self.vm = ""
        self.rank = 0
        self.subnet_id = 0
        self.terminated = threading.Event()

    @property
    def handle(self) -> Any:
        """The VM's cut steps through the driver (provisioning.coordinated.DriverHandle)."""
        from provisioning.coordinated import DriverHandle  # heavy: libvirt-python (the driver)

        return DriverHandle(self.driver, self.vm, self.node)

    def serve(self) -> int:
        """The member's life; its exit status (0: told to end, or its leader gone and handled)."""
        old = signal.signal(signal.SIGTERM, lambda *_: self.terminated.set()) if _main_thread() else None
        try:
            try:
                self._setup(self.link.recv(SETUP_TIMEOUT_S))
            except (LinkError, VjobError) as exc:
                _log.error("member: no setup from the leader", node=self.node, error=str(exc))
                return 1
            while True:
                try:
                    msg = self.link.recv(None)  # a dead leader: EOF, or TCP keep-alive on a silent host
                except LinkError as exc:
                    self._leader_gone(str(exc))
                    return 0
                if msg.get("op") == "bye":
                    _log.info("member: released by the leader", vm=self.vm, node=self.node)
                    return 0
                self._answer(msg)
        finally:
            self.link.close()
            if old is not None:
                signal.signal(signal.SIGTERM, old)

    def _setup(self, msg: dict[str, Any]) -> None:
        if msg.get("op") != "setup":
            raise VjobError(f"the leader's first message is {str(msg.get('op'))[:40]!r}, not setup")
        rank, subnet = msg.get("rank"), msg.get("subnet_id")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= 4096:
            raise VjobError(f"setup.rank = {str(rank)[:20]!r}: must be an integer in 1..4096")
        if not isinstance(subnet, int) or isinstance(subnet, bool) or not 1 <= subnet <= 65535:
            raise VjobError(f"setup.subnet_id = {str(subnet)[:20]!r}: must be an integer in 1..65535")
        vm = check_name("VM", str(msg.get("vm", "")))
        if not vm.endswith(f"-{rank}"):
            raise VjobError(f"setup.vm = {vm!r}: not the VM of rank {rank}")
        self.vm, self.rank, self.subnet_id = vm, rank, subnet
        if self._site_factory is not None:
            site = self._site_factory(rank + 1)  # vmID = rank + 1 (provisioning.network)
            self.site = site if site.enabled else None
        self.link.send({"ok": True})
        _log.info("member: set up", vm=vm, rank=rank, node=self.node)

    def _answer(self, msg: dict[str, Any]) -> None:
        op = str(msg.get("op", ""))
        try:
            for key in NODE_FIELDS:
                if key in msg:
                    check_name("node", str(msg[key]))
            reply = self._do(op, msg)
            self.link.send({"ok": True, **reply})
        except LinkError:
            raise
        except VjobError as exc:
            self.link.send({"ok": False, "error": str(exc)})
        except Exception as exc:  # noqa: BLE001 - the leader decides (rollback); the member lives on
            _log.error("member: request failed", op=op[:20], error=repr(exc))
            self.link.send({"ok": False, "error": f"{type(exc).__name__}: {exc}"})

    def _do(self, op: str, msg: dict[str, Any]) -> dict[str, Any]:
        h, d = self.handle, self.driver
        if op == "state":
            state = h.state(str(msg["node"]) if "node" in msg else None)
            return {"state": state.value if state is not None else None}
        if op == "pause":
            return {"paused": h.pause()}
        if op == "save":
            job_id = msg.get("job_id")
            snap = h.save(
                job_id=job_id if isinstance(job_id, int) else None, bypass_cache=msg.get("bypass_cache") is True
            )
            self._forget_definition()
            return {
                "memory_path": str(snap.memory_path),
                "size_bytes": snap.size_bytes,
                "sha256": snap.sha256,
                "kind": snap.kind,
                "created_at": snap.created_at,
                "overlay_path": str(snap.overlay_path) if snap.overlay_path else "",
            }
        if op == "restore":
            self._network_up()
            h.restore(
                from_node=str(msg.get("from_node") or self.node),
                paused=msg.get("paused") is True,
                bypass_cache=msg.get("bypass_cache") is True,
            )
            return {}
        if op == "unpause":
            h.unpause()
            return {}
        if op == "workdir":
            job_cwd = str(msg.get("cwd", ""))
            self.same_workdir = member_workdir.sees_probe(self.workdir, job_cwd, msg.get("probe"), msg.get("nonce"))
            if not self.same_workdir[0]:
                _log.warning(
                    "member: not the batch step's working directory",
                    vm=self.vm,
                    node=self.node,
                    why=self.same_workdir[1],
                )
            return {"same": self.same_workdir[0], "why": self.same_workdir[1]}
        if op == "define":
            net = msg.get("job", {}).get("network") if isinstance(msg.get("job"), dict) else None
            if isinstance(net, dict) and net.get("ssh_private"):
                net["ssh_private"] = self.link.unseal(str(net["ssh_private"]))
            workdir = self._sent_disk(msg["disk"]) if "disk" in msg else self._own_dir()
            nic = self._network_up()
            fields = {**msg, "bridge": network.bridge_name(self.subnet_id), "site_nic": nic}
            d.define(self.build_spec(fields, self.vm, self.rank, workdir), self.node)
            return {}
        if op == "boot":
            self._network_up()
            d.boot(self.vm, self.node)
            return {}
        if op == "delete":
            d.delete(self.vm, self.node)
            self._network_down()
            return {}
        if op == "forget":
            d.delete(self.vm, str(msg["node"]))
            return {}
        if op == "remove_network":
            self._network_down()
            return {}
        if op == "cpu":
            reading = DriverVM(d, self.vm, self.node, lambda: None).cpu()
            return {"cpu": list(reading) if reading is not None else None}
        raise VjobError(f"unknown request {op[:20]!r}")

    def _forget_definition(self) -> None:
        """After a save into a node-local directory (`user_vm_dir`, a user's member): forget the
        domain in this node's session libvirt, as a one-VM pilot does (pilot.vm.DriverVM.save).
        Why: the VM resumes on another host, whose pilot cannot reach this session daemon, so
        the definition would stay here for good (found on two hosts, issue 38); a restore here
        defines it again from the state file."""
        if self.driver.config.user_vm_dir and os.geteuid() != 0:
            DriverVM(self.driver, self.vm, self.node, lambda: None)._undefine()

    def _network_up(self) -> SiteNic | None:
        """This node's part of the job's network, before the VM is defined, boots or is restored:
        the VM's tap from the node service where the site runs one (its NIC; the same name on
        every node, so a saved VM restores onto it anywhere), else the job's bridge on this
        node's libvirt (root's; None)."""
        if self.site is not None:
            self.site.up()
            return self.site.nic(self.rank + 1)
        network.ensure_bridge(self.driver.connection(self.node), self.subnet_id)
        return None

    def _network_down(self) -> None:
        """Given back after a cut and at the end: nothing of the job stays on a node it left."""
        if self.site is not None:
            self.site.down()  # never raises: the service's sweep removes what is left
            return
        network.remove_bridge(self.driver.connection(self.node), self.subnet_id)

    def _own_dir(self) -> Path:
        """The directory to build the job disk from: only the batch step's (never srun's /tmp fallback)."""
        same, why = self.same_workdir
        if not same or self.workdir is None:
            raise VjobError(f"no job disk built here: {why}; the leader must send it")
        return self.workdir

    def _sent_disk(self, expected: object) -> None:
        """The job disk the leader built and sent (its node lacks the working directory), checked
        here against what the leader built before the VM may use it; a copy that differs is removed."""
        if (
            not isinstance(expected, dict)
            or not isinstance(expected.get("size_bytes"), int)
            or not isinstance(expected.get("sha256"), str)
        ):
            raise VjobError("define.disk: must be {size_bytes: int, sha256: str}")
        disk = self.driver.job_disk_path(self.vm, self.node)
        host = self.driver.host(self.node)
        try:
            integrity.check_against(self.vm, self.node, disk, expected, host)
        except VjobError as exc:
            transfer.remove(transfer.Endpoint(disk, host))
            raise VjobError(f"the job disk the leader sent is refused ({exc}); removed here") from None
        _log.info("member: job disk received from the leader", vm=self.vm, node=self.node, bytes=expected["size_bytes"])

    def _leader_gone(self, why: str) -> None:
        """No leader to finish the cut: a paused VM is at the cut and is saved; a running one is
        left running (the next pilot adopts it); nothing else is decided here."""
        if not self.vm:
            return
        try:
            if self.handle.paused():
                snap = self.handle.save(job_id=None, bypass_cache=False)
                _log.warning(
                    "member: leader gone with the VM paused: saved at the cut",
                    vm=self.vm,
                    node=self.node,
                    bytes=snap.size_bytes,
                    why=why,
                )
                if self.site is not None:
                    self.site.down()  # the next pilot asks again where it lands
                return
            state = self.handle.state()
        except VjobError as exc:
            _log.error("member: leader gone, the VM could not be saved", vm=self.vm, error=str(exc), why=why)
            return
        _log.warning(
            "member: leader gone; the VM is not paused, left as it is",
            vm=self.vm,
            node=self.node,
            state=state.value if state is not None else None,
            why=why,
        )


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
