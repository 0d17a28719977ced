"""A multi-node vjob: one VM per node of the allocation, on a private network of the job.

Why the first node's pilot drives every VM (through the VM driver, each VM on its node's
libvirt) rather than one independent pilot per node: a checkpoint must be one consistent cut
(provisioning.coordinated pauses every VM before any is saved) and a resume must bring them
all back paused before any runs. One process that holds every VM does that without a
distributed protocol between pilots; the Pilot's life cycle (boot, adopt, save on SIGTERM or
on a request, restore, finish) is unchanged, `JobVMs` stands in for its one VM.

The VMs are `<vjob name>-<rank>` (vjob.pilot_files.vm_names: the agent derives the same names
from the job id and believes no other); rank 0 runs the user's script, the others wait reachable as
`vm1`, `vm2`… (provisioning.network gives the MACs, addresses and host file); every VM has a
copy of the working directory on its job disk, only rank 0's is copied back at the end.

With per-node pilots (`[agent] multinode_pilots = "per-node"`, and always for an ordinary user's
job, whose session libvirt no other node reaches: pilot.members.launch.pilots_mode;
pilot.members.leader) the VMs of ranks 1… are `MemberVM`s: their member pilot builds, boots,
pauses, saves and restores them on its own node at this pilot's word; the cut is still
provisioning.coordinated's, through them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pilot.members.leader import MemberVM
from pilot.site_network import SiteLink
from pilot.vm import DriverVM
from provisioning import network
from vjob import log
from vjob.errors import VjobError
from vjob.model import VMState
from vjob.pilot_files import member_names
from vjob.store.identities import Address

_log = log.get("pilot")


class MoveRolledBack(VjobError):
    """A move of the whole job failed and was undone: every VM runs again where it slept."""


def network_of(addresses: Sequence[Address], rank: int, ssh: tuple[str, str] | None) -> dict[str, object]:
    """job.json's `network` for the VM of `rank` (provisioning.guest_agent.agent.parse_network)."""
    peers = network.peers(addresses)
    me = peers[rank]
    return {
        "mac": me.mac,
        "ip": str(me.ip),
        "prefix": 24,
        "peers": [[str(p.ip), p.hostname] for p in peers],
        "leader": rank == 0,
        "ssh_private": ssh[0] if ssh else "",
        "ssh_public": ssh[1] if ssh else "",
    }


class JobVMs:
    """The VMs of one multi-node job, driven together; the Pilot sees the first one."""

    def __init__(
        self,
        driver: Any,
        vm: str,
        nodes: Sequence[str],
        subnet_id: int,
        spec_factory: Callable[[int, str, str], Any],
        remotes: Sequence[MemberVM] = (),
        describe: Callable[[int], dict[str, Any]] | None = None,
        site: SiteLink | None = None,
    ) -> None:
        """`spec_factory(rank, vm name, node)` builds the VMSpec of one VM (its job disk too);
        `remotes`: the member pilots' VMs of ranks 1… (per-node pilots), each defined from
        `describe(rank)` on its own node; `site`: the node service's job network for this
        pilot's own node (pilot.site_network), made instead of a libvirt bridge there."""
        self.site = site if site is not None and site.enabled else None
        self.driver = driver
        self.subnet_id = subnet_id
        self._spec_factory = spec_factory
        self._describe = describe
        self._settled = False
        names = member_names(vm, len(nodes))
        self.members: list[DriverVM | MemberVM] = [
            DriverVM(driver, name, node, (lambda r=rank, n=name, nd=node: spec_factory(r, n, nd)))
            for rank, (name, node) in enumerate(zip(names, nodes, strict=True))
        ]
        for rank, remote in enumerate(remotes, start=1):
            if (remote.name, remote.node) != (names[rank], nodes[rank]):
                raise VjobError(
                    f"member pilot of rank {rank}: {remote.name} on {remote.node}, expected "
                    f"{names[rank]} on {nodes[rank]}"
                )
            self.members[rank] = remote
        self.leader = self.members[0]
        self.home = tuple(nodes)
        """The allocation's nodes, one per VM: a VM off them was moved whole by the agent
        (`move`), and the pilot then holds its nodes at the job's end (Pilot._hold_while_lent)."""
        self.name = self.leader.name
        self.node = self.leader.node
        self.uri = self.leader.uri

    def nodes(self) -> list[str]:
        return [m.node for m in self.members]

    def _coordinated(self, from_nodes: Sequence[str] = ()) -> list[Any]:
        from provisioning.coordinated import Member  # heavy: libvirt-python (the driver)

        froms = list(from_nodes) if len(from_nodes) == len(self.members) else [m.node for m in self.members]
        return [
            Member(m.name, m.node, from_node=f, handle=m if isinstance(m, MemberVM) else None)
            for m, f in zip(self.members, froms, strict=True)
        ]

    def _handles(self) -> list[Any]:
        """Each VM's cut steps: a member pilot's VM through its link, the others through the driver."""
        from provisioning import coordinated  # heavy: libvirt-python (the driver)

        return [coordinated.handle(self.driver, m) for m in self._coordinated()]

    def _local_nodes(self) -> list[str]:
        """The nodes whose bridge this pilot makes (a member pilot makes its own node's)."""
        return list(dict.fromkeys(m.node for m in self.members if not isinstance(m, MemberVM)))

    def _ensure_network(self) -> None:
        if self.site is not None:  # first: a libvirt network of the same name would take the bridge's name
            self.site.up()
        for node in self._local_nodes():  # one bridge per node (libvirt), in node order
            if self.site is None or node != self.site.node:
                network.ensure_bridge(self.driver.connection(node), self.subnet_id, host=self.driver.host(node))

    def _remove_network(self) -> None:
        if self.site is not None:
            self.site.down()
        for node in self._local_nodes():
            try:
                network.remove_bridge(self.driver.connection(node), self.subnet_id)
            except Exception as exc:  # noqa: BLE001 - a bridge left behind costs nothing; logged
                _log.warning("job network not removed", node=node, error=str(exc))
        for m in self.members:
            if isinstance(m, MemberVM):
                try:
                    m.remove_network()
                except VjobError as exc:
                    _log.warning("job network not removed", node=m.node, error=str(exc))

    def console_log(self) -> Path:
        return self.leader.console_log()

    def output_logs(self) -> tuple[Path, Path]:
        return self.leader.output_logs()

    def active(self) -> bool:
        if not self._settled:  # the pilot's first look: finish a cut a killed pilot left half done
            self._settled = True
            self._finish_cut()
        return self.leader.active()

    def leftover(self) -> bool:
        """Whether any VM of the job's names is on its node (asked before a first start; the
        half-done cut `active` finishes is then never this job's)."""
        return any(m.leftover() for m in self.members)

    def _finish_cut(self) -> None:
        """A pilot SIGKILLed during a coordinated save (the RMS's grace time ran out) leaves some
        VMs saved and the others paused — all at the moment of the cut, since every VM was paused
        before any save began. Restoring the saved ones paused and letting all run again gives
        back that one consistent state; booting afresh would lose the job."""
        pairs = [(m, h, h.state()) for m, h in zip(self.members, self._handles(), strict=True)]
        saved = [(m, h) for m, h, st in pairs if st == VMState.SAVED]
        live = [(m, h) for m, h, st in pairs if st == VMState.RUNNING]  # paused ones count: libvirt's "active"
        if not live:
            return  # nothing half done: a whole save is restored the usual way
        if saved:
            self._ensure_network()
        for m, h in saved:
            h.restore(from_node=m.node, paused=True, bypass_cache=False)
        for _m, h in saved + live:  # also VMs paused by a pilot killed before any save: they run again
            h.unpause()
        if saved:
            _log.warning(
                "half-done checkpoint undone: the job runs on",
                saved=[m.name for m, _ in saved],
                paused=[m.name for m, _ in live],
            )

    def boot(self) -> None:
        saved = [h for h in self._handles() if h.state() == VMState.SAVED]
        if saved and len(saved) == len(self.members):
            _log.warning("the job's VMs are saved though the pilot never said so: restoring them")
            self.restore(self.node, self.nodes())  # killed between the cut and its state file
            return
        self._ensure_network()
        try:
            for rank, m in enumerate(self.members):  # every job disk first: the VMs then boot together
                if isinstance(m, MemberVM):
                    m.define(
                        self._describe(rank) if self._describe else {}, lambda r=rank, mm=m: self._place_disk(r, mm)
                    )
                else:
                    self.driver.define(self._spec_factory(rank, m.name, m.node), m.node)
            for m in reversed(self.members):  # the script's VM last
                if isinstance(m, MemberVM):
                    m.boot()
                else:
                    self.driver.boot(m.name, m.node)
        except Exception:
            self._remove_network()  # the VMs are kept for a look; the bridge is made again by a retry
            raise

    def _place_disk(self, rank: int, m: MemberVM) -> dict[str, Any]:
        """A member's job disk built here as the leader mode builds it, then put on its node."""
        self._spec_factory(rank, m.name, m.node)
        return dict(self.driver.place_job_disk(m.name, m.node))

    def save(self) -> tuple[Path, int]:
        from provisioning import coordinated  # heavy: libvirt-python (the driver)

        cut = coordinated.checkpoint(self.driver, self._coordinated())
        snap = cut.snapshots[self.leader.name]
        if self.driver.config.user_vm_dir and os.geteuid() != 0:  # as DriverVM.save: node-local session
            for m in self.members:  # libvirt, which a resume on another host cannot reach (issue 38)
                if isinstance(m, DriverVM):
                    m._undefine()
        self._remove_network()
        _log.info(
            "multi-node job saved",
            vms=len(self.members),
            consistent=cut.consistent,
            pause_to_saved_s=round(cut.pause_to_saved_s, 3),
        )
        return Path(snap.memory_path), sum(int(s.size_bytes) for s in cut.snapshots.values())

    def restore(self, saved_on: str, member_nodes: Sequence[str] = ()) -> None:
        from provisioning import coordinated  # heavy: libvirt-python (the driver)

        self._ensure_network()
        froms = list(member_nodes) or self.nodes()  # each state where its VM is, unless told
        resumed = coordinated.restore(self.driver, self._coordinated(froms))
        _log.info(
            "multi-node job restored",
            vms=len(self.members),
            restore_to_running_s=round(resumed.restore_to_running_s, 3),
        )

    def movable(self) -> str:
        """Why this job's VMs cannot be resumed on other nodes ("" when they can): a member
        pilot's VM is driven on its own node by that member, which exists on no other node; a
        job network from the node service is this pilot's node's only (the other nodes' taps
        are their members' to ask)."""
        if any(isinstance(m, MemberVM) for m in self.members):
            return "its VMs are driven by per-node pilots, each on its own node: none can resume a VM elsewhere"
        if self.site is not None:
            return "its job network is the node service's of this pilot's node: its VMs cannot leave their nodes"
        return ""

    def move(self, destinations: Sequence[str]) -> None:
        """Resume the sleeping job with VM `rank` on `destinations[rank]`, each state copied from
        where it slept and checked on arrival (provisioning.coordinated.restore: all restored
        paused, then all run). If any restore fails, the whole job is rolled back: every VM
        restored where it slept (a state the failed attempt restored and saved again on its new
        node is copied back), and the error raised — no VM is left on a new node while another
        stays behind. Only a leader-mode pilot without a node service moves (`movable`)."""
        why = self.movable()
        if why:
            raise VjobError(why)
        slept = self.nodes()
        if len(destinations) != len(slept) or len(set(destinations)) != len(destinations):
            raise VjobError(f"a move of {len(slept)} VMs needs one distinct node each, not {', '.join(destinations)}")
        self._point_at(destinations)
        try:
            self.restore(self.node, slept)
        except Exception as exc:  # any failure: roll back, then say why
            self._point_at(slept)
            try:
                self.restore(self.node, destinations)  # each from where the failed attempt left it
            except Exception as back:  # noqa: BLE001 - states kept where they are; the pilot says so
                raise VjobError(f"the move failed ({exc}) and so did the resume where the VMs slept: {back}") from exc
            self._drop_bridges(set(destinations) - set(slept))
            raise MoveRolledBack(f"rolled back, every VM running where it slept: {exc}") from exc
        self._drop_bridges(set(slept) - set(destinations))

    def _point_at(self, nodes: Sequence[str]) -> None:
        for m, node in zip(self.members, nodes, strict=True):
            assert isinstance(m, DriverVM)  # movable() refused member pilots' VMs
            m.node, m.uri = node, self.driver.uri(node)
        self.node, self.uri = self.leader.node, self.leader.uri

    def _drop_bridges(self, nodes: set[str]) -> None:
        """The job's bridge on nodes none of its VMs is on any more — unless such a node's
        libvirt is one a VM is still on (the dev cluster's nodes share one libvirtd: the bridge
        there is the moved VMs' too)."""
        kept = {self.driver.uri(m.node) for m in self.members}
        for node in sorted(n for n in nodes if self.driver.uri(n) not in kept):
            try:
                network.remove_bridge(self.driver.connection(node), self.subnet_id)
            except Exception as exc:  # noqa: BLE001 - a bridge left behind costs nothing; logged
                _log.warning("job network not removed", node=node, error=str(exc))

    def delete(self) -> None:
        for m in self.members:
            m.delete()
        self._remove_network()

    def collect(self, workdir: Path) -> int | None:
        return self.leader.collect(workdir)

    def cpu(self) -> tuple[float, int] | None:
        """CPU seconds and vCPUs of all the job's VMs together; None when one is unreadable."""
        readings = [m.cpu() for m in self.members]
        if any(r is None for r in readings):
            return None
        return sum(r[0] for r in readings if r), sum(r[1] for r in readings if r)

    def forget(self, node: str) -> None:
        for m in self.members:
            m.forget(node)
            if m.node != node:
                m.forget(m.node)
