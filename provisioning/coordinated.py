"""Coordinated checkpoint of a job's VMs: one consistent cut over all of them.

Why: the VMs of a parallel job talk to each other. Saving them one after another lets the
later ones run on and send messages the earlier ones never receive (they were saved before):
after a restore the job deadlocks or computes garbage. Pausing every VM first (a pause is a
few milliseconds and stops the vCPUs, so no VM can send anything more), then saving them all
in parallel, gives one cut; restoring them all paused and letting them run together only when
every one is back keeps the cut on the way back too.

The agent, the PBS hook and Saline call this one module (`checkpoint`, `restore`): the
timestamps it returns let a test, or an operator reading the log, check that every VM was
paused before any save began. Each VM's steps (pause, save, restore, unpause) go through a
`VMHandle`: the driver by default, or another process that holds the VM on its own node (a
per-node pilot, pilot.members.leader), so the one cut logic here serves both.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from provisioning.driver import Driver
from provisioning.vm_types import DriverError, Snapshot
from vjob import log
from vjob.model import VMState

_log = log.get("provisioning")
T = TypeVar("T")


class VMHandle(Protocol):
    """The per-VM steps of a cut, on the VM's own node (DriverHandle: through the driver)."""

    def pause(self) -> bool: ...

    def save(self, *, job_id: int | None, bypass_cache: bool) -> Snapshot: ...

    def restore(self, *, from_node: str, paused: bool, bypass_cache: bool) -> None: ...

    def unpause(self) -> None: ...

    def state(self, node: str | None = None) -> VMState | None: ...


@dataclass(frozen=True)
class Member:
    """One VM of the job and the node it is on (for a restore: the node it goes to, and the
    node its state is on when that differs); `handle` when another process drives the VM."""

    vm: str
    node: str
    from_node: str | None = None
    handle: VMHandle | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class DriverHandle:
    """A VM's cut steps through the VM driver (the driver reaches the VM's node's libvirt)."""

    driver: Driver
    vm: str
    node: str

    def pause(self) -> bool:
        return self.driver.pause(self.vm, self.node)

    def save(self, *, job_id: int | None, bypass_cache: bool) -> Snapshot:
        return self.driver.save(self.vm, self.node, job_id=job_id, bypass_cache=bypass_cache)

    def restore(self, *, from_node: str, paused: bool, bypass_cache: bool) -> None:
        self.driver.restore(self.vm, self.node, from_node=from_node, paused=paused, bypass_cache=bypass_cache)

    def unpause(self) -> None:
        self.driver.unpause(self.vm, self.node)

    def state(self, node: str | None = None) -> VMState | None:
        return self.driver.state(self.vm, node or self.node)

    def paused(self) -> bool:
        """libvirt's word, read only (a member whose leader is gone saves only a paused VM)."""
        import libvirt  # heavy: libvirt-python

        try:
            dom = self.driver.connection(self.node).lookupByName(self.vm)
            return bool(dom.isActive()) and dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED
        except libvirt.libvirtError:
            return False


def handle(driver: Driver, m: Member) -> VMHandle:
    """Who carries out `m`'s steps: its own handle, else the driver."""
    return m.handle if m.handle is not None else DriverHandle(driver, m.vm, m.node)


@dataclass
class Cut:
    """What a coordinated checkpoint did, with wall-clock times (time.time()) per VM."""

    paused_at: dict[str, float] = field(default_factory=dict)
    save_started_at: dict[str, float] = field(default_factory=dict)
    saved_at: dict[str, float] = field(default_factory=dict)
    snapshots: dict[str, Snapshot] = field(default_factory=dict)

    @property
    def consistent(self) -> bool:
        """Every VM was paused before the first save began."""
        if not self.save_started_at:
            return True
        return max(self.paused_at.values(), default=0.0) <= min(self.save_started_at.values())

    @property
    def pause_to_saved_s(self) -> float:
        """From the first pause to the last saved state: how long the job was frozen for the cut."""
        if not self.saved_at:
            return 0.0
        return max(self.saved_at.values()) - min(self.paused_at.values(), default=max(self.saved_at.values()))


@dataclass
class Resumed:
    """What a coordinated restore did: when each VM was back (paused) and when all ran again."""

    started_at: float = 0.0
    restored_at: dict[str, float] = field(default_factory=dict)
    running_at: float = 0.0

    @property
    def restore_to_running_s(self) -> float:
        """From the start of the restore (copies included) to every VM running again."""
        return self.running_at - self.started_at


def _parallel(fn: Callable[[Member], T], members: Sequence[Member]) -> list[T | BaseException]:
    """`fn` on every member at once; each result or the exception it raised, in order."""
    if not members:
        return []
    with ThreadPoolExecutor(max_workers=len(members), thread_name_prefix="vjob-coord") as pool:
        futures = [pool.submit(fn, m) for m in members]
        out: list[T | BaseException] = []
        for fut in futures:
            try:
                out.append(fut.result())
            except BaseException as exc:  # noqa: BLE001 - collected, raised once all are done
                out.append(exc)
    return out


def _check_names(members: Sequence[Member]) -> None:
    names = [m.vm for m in members]
    if len(set(names)) != len(names):
        raise DriverError("checkpoint", "-", ",".join(sorted({m.node for m in members})), f"VM listed twice: {names}")


def checkpoint(
    driver: Driver, members: Sequence[Member], *, job_id: int | None = None, bypass_cache: bool = False
) -> Cut:
    """Pause every running VM of the job, check they all are paused, then save them in parallel.

    Idempotent like `Driver.save`: a VM already saved (a repeated call after a crash) keeps its
    state. If a save fails, the cut is abandoned: the VMs already saved are restored where
    they are, the paused ones run again, and the error is raised, so the job never stays
    frozen or half-saved.
    """
    _check_names(members)
    cut = Cut()

    def pause(m: Member) -> bool:
        paused = handle(driver, m).pause()
        cut.paused_at[m.vm] = time.time()
        return paused

    pause_results = _parallel(pause, members)
    errors = [r for r in pause_results if isinstance(r, BaseException)]
    live = [m for m, r in zip(members, pause_results, strict=True) if r is True]
    if errors:
        _rollback(driver, live, saved=[])
        raise errors[0]
    for m in live:  # libvirt's own word, not ours: every VM is paused before any save begins
        if handle(driver, m).pause() is not True:
            _rollback(driver, live, saved=[])
            raise DriverError("checkpoint", m.vm, m.node, "the VM did not stay paused; no state was saved")

    def save(m: Member) -> Snapshot:
        cut.save_started_at[m.vm] = time.time()
        snap = handle(driver, m).save(job_id=job_id, bypass_cache=bypass_cache)
        cut.saved_at[m.vm] = time.time()
        return snap

    results = _parallel(save, members)
    failed = [(m, r) for m, r in zip(members, results, strict=True) if isinstance(r, BaseException)]
    if failed:
        done = [m for m, r in zip(members, results, strict=True) if isinstance(r, Snapshot) and m in live]
        _rollback(driver, [m for m, _ in failed if m in live], saved=done)
        raise failed[0][1]
    cut.snapshots = {m.vm: r for m, r in zip(members, results, strict=True) if isinstance(r, Snapshot)}
    _log.info(
        "coordinated checkpoint",
        vms=[m.vm for m in members],
        consistent=cut.consistent,
        pause_to_saved_s=round(cut.pause_to_saved_s, 3),
        paused_at=cut.paused_at,
        save_started_at=cut.save_started_at,
    )
    return cut


def _rollback(driver: Driver, paused: Sequence[Member], *, saved: Sequence[Member]) -> None:
    """Undo half a cut: saved VMs are restored on their node, paused ones run again."""
    for m in saved:
        try:
            handle(driver, m).restore(from_node=m.node, paused=False, bypass_cache=False)
        except DriverError as exc:
            _log.error("rollback restore failed", vm=m.vm, node=m.node, error=str(exc))
    for m in paused:
        try:
            h = handle(driver, m)
            if h.state() == VMState.RUNNING:
                h.unpause()
        except DriverError as exc:
            _log.error("rollback unpause failed", vm=m.vm, node=m.node, error=str(exc))


def restore(
    driver: Driver, members: Sequence[Member], *, bypass_cache: bool = False, label: str | None = None
) -> Resumed:
    """Restore every VM of the job (in parallel, each paused), then let them all run.

    Each state is verified before its restore (and, from another node, copied and checked on
    the destination). If one restore fails, the VMs already back are saved again, so the job
    keeps one consistent snapshot rather than half a running job; the error is raised.
    With `label`, each VM comes from its labelled snapshot in its node's snapshot dir (Saline's
    resume from the repository) instead of its saved state; if one fails, the VMs already back
    are deleted again: the snapshot they came from is still there.
    """
    _check_names(members)
    done = Resumed(started_at=time.time())

    def one(m: Member) -> None:
        if label is not None:
            if m.handle is not None:  # Saline's repository snapshots are driven by its own driver only
                raise DriverError("restore", m.vm, m.node, "a labelled snapshot is restored through the driver only")
            driver.restore_snapshot(m.vm, m.node, label=label, from_node=m.from_node, paused=True)
            done.restored_at[m.vm] = time.time()
            return
        src, h = m.from_node or m.node, handle(driver, m)
        if src != m.node and h.state(src) is None and h.state() == VMState.SAVED:
            src = m.node  # moved by an earlier, failed attempt and saved again where it went
        h.restore(from_node=src, paused=True, bypass_cache=bypass_cache)
        done.restored_at[m.vm] = time.time()

    results = _parallel(one, members)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        back = [m for m, r in zip(members, results, strict=True) if not isinstance(r, BaseException)]
        for m in back:
            try:
                if label is not None:
                    driver.delete(m.vm, m.node)
                    continue
                handle(driver, m).save(job_id=None, bypass_cache=False)
            except DriverError as exc:
                _log.error("re-save after a failed restore failed", vm=m.vm, node=m.node, error=str(exc))
        raise failed[0]
    for m in members:
        handle(driver, m).unpause()
    done.running_at = time.time()
    _log.info("coordinated restore", vms=[m.vm for m in members], nodes=[m.node for m in members])
    return done
