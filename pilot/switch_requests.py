"""The pilot's side of a live context switch: suspend, resume on a node, migrate, stop.

Why in the pilot and not in the agent: the pilot is the one process that owns its vjob's VM
for the whole life of the job (it holds the RMS allocation, copies the guest's output, saves
on SIGTERM). The agent only writes a request (vjob.pilot_files.RequestKind) and waits for the
answer in the state file; the pilot carries it out through the VM driver, which reaches every
node by its libvirt URI. A `suspend` keeps the job allocated and the VM asleep on disk until a
`resume` names where it wakes up — Entropy's sleeping state, not the RMS's requeue.

Answers: the pilot writes the request's id in its state once it is done (RUNNING on the new
node, SAVED with the memory state, FINISHED), or with `request_error` when it could not do it;
a request already answered is never carried out twice, so the agent may repeat a request after
a crash (agent.recover) without the VM moving twice.

A multi-node job (pilot.multinode) is one cut of all its VMs: `suspend` saves them all
(provisioning.coordinated), `stop` deletes them all, and a `resume` restores them all — where
they slept, or each on its own new node when the request's `nodes` lists one per VM in rank
order (its `node` then the first: the remapping's or the planner's move of the whole job, one
cut; a state copied from where it slept and checked on arrival; any failure rolls the whole job
back where it slept). A `migrate` would move its VMs one by one and is refused with a
`request_error` that says so, and so is a resume elsewhere of a job whose VMs cannot leave their
nodes (per-node pilots, a node service's job network: JobVMs.movable).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from pilot import pause_drain
from pilot.multinode import MoveRolledBack
from pilot.settings import PilotSettings
from pilot.signals import Signals
from pilot.vm import DriverVM
from vjob.errors import VjobError
from vjob.pilot_files import CheckpointRequest, PilotDir, PilotState, PilotStatus, RequestKind

EXIT_STOPPED = 0


class SwitchedPilot(Protocol):
    """What a switch request needs of its pilot (pilot.pilot.Pilot, the one that carries it out):
    its state, settings, signals, directory and VM, and its public verbs. Why a protocol: the
    pilot calls `carry_out` from its loop, so this module must not import it back."""

    status: PilotStatus | None
    s: PilotSettings
    signals: Signals
    pdir: PilotDir
    vm: DriverVM
    log: Any

    def save(self, request_id: str, nodes: tuple[str, ...] = ()) -> None: ...

    def set_state(self, state: PilotState, **changes: Any) -> None: ...

    def say(self, text: str) -> None: ...

    def retail(self) -> None: ...

    def output_marks(self) -> tuple[int, list[int]]: ...


def carry_out(pilot: SwitchedPilot, req: CheckpointRequest) -> int | None:
    """Carry out one switch request; returns the pilot's exit status when the job ends, else None."""
    st = pilot.status
    assert st is not None
    if req.request_id == st.request_id:
        return None  # answered already (or being slept on): nothing to do twice
    try:
        if req.kind is RequestKind.PAUSE_CHECKPOINT:  # the RMS's checkpoint that hands the CPUs over first
            return pause_drain.checkpoint(pilot, req)
        if req.kind is RequestKind.SUSPEND:
            pilot.save(req.request_id, req.nodes)
            return _sleep(pilot, req.request_id)
        if req.kind is RequestKind.MIGRATE:
            _migrate(pilot, req)
            return None
        if req.kind is RequestKind.STOP:
            return _stop(pilot, req.request_id)
        raise VjobError(f"a {req.kind.value} request needs a sleeping VM; VM {pilot.vm.name} is running")
    except VjobError as exc:
        _refuse(pilot, req.request_id, str(exc))
        return None


def _refuse(pilot: SwitchedPilot, request_id: str, error: str) -> None:
    assert pilot.status is not None
    pilot.log.error("switch request failed", request=request_id, error=error)
    pilot.set_state(pilot.status.state, request_id=request_id, request_error=error[:2000])


def _sleep(pilot: SwitchedPilot, suspend_id: str) -> int | None:
    """Asleep after a `suspend`: wait for a resume or a stop; a withdrawn request wakes the VM
    where it slept (the switch was rolled back); SIGTERM ends the pilot with the VM saved."""
    while True:
        if pilot.signals.terminate.wait(pilot.s.poll_s):
            pilot.say("ended by the resource manager while asleep: VM state kept")
            return 0
        try:
            req = pilot.pdir.read_request()
        except VjobError as exc:
            pilot.log.warning("unreadable request while asleep", error=str(exc))
            continue
        if req is None:
            pilot.say("suspend withdrawn: resuming the VM where it slept")
            _resume(pilot, pilot.vm.node, pilot.vm.node, "")
            return None
        if req.request_id == suspend_id:
            continue
        assert pilot.status is not None
        if req.request_id == pilot.status.request_id:
            continue  # a request refused while asleep, not yet replaced
        try:
            if req.kind is RequestKind.RESUME:
                if len(pilot.vm.nodes()) > 1:
                    if not _resume_job(pilot, req):
                        return None  # rolled back: running where it slept, the refusal answered
                else:
                    _resume(pilot, req.node, req.from_node or pilot.status.saved_node or pilot.vm.node, req.request_id)
                return None
            if req.kind is RequestKind.STOP:
                return _stop(pilot, req.request_id)
            raise VjobError(f"a {req.kind.value} request needs a running VM; VM {pilot.vm.name} sleeps")
        except VjobError as exc:
            _refuse(pilot, req.request_id, str(exc))


def _resume(pilot: SwitchedPilot, node: str, saved_on: str, request_id: str) -> None:
    """Restore the sleeping VM on `node` from its state on `saved_on` (a copy when they differ)."""
    assert pilot.status is not None
    local = saved_on == node
    several = len(pilot.vm.nodes()) > 1  # a multi-node job (pilot.multinode): one cut for all its VMs
    if several and (node != pilot.vm.node or not local):
        raise VjobError(_one_by_one(pilot, f"a resume on {node}" + ("" if local else f" from {saved_on}")))
    pilot.say(f"resuming VM {pilot.vm.name} on {node}" + ("" if local else f" (state copied from {saved_on})"))
    pilot.set_state(PilotState.RESTORING)
    t0 = time.monotonic()
    if several:
        pilot.vm.restore(saved_on, pilot.status.member_nodes)
    else:
        pilot.vm.driver.restore(pilot.vm.name, node, from_node=saved_on)
    took = time.monotonic() - t0
    _moved_to(pilot, node)
    st = pilot.status
    pilot.set_state(
        PilotState.RUNNING,
        node=node,
        uri=pilot.vm.uri,
        memory_path="",
        restores=st.restores + 1,
        local_restores=st.local_restores + (1 if local else 0),
        restore_seconds=took,
        request_id=request_id,
        request_error="",
    )
    pilot.log.info("resumed", node=node, local=local, seconds=round(took, 3))


def _resume_job(pilot: SwitchedPilot, req: CheckpointRequest) -> bool:
    """A multi-node job's resume: in place (no `nodes`, or the nodes they slept on), or the whole
    job moved, VM `rank` onto `req.nodes[rank]` (JobVMs.move: one cut, rolled back whole on a
    failure). The request is the agent's (root's) but checked all the same: one node per VM,
    no node twice, `node` the first VM's."""
    assert pilot.status is not None
    slept = list(pilot.vm.nodes())
    dest = list(req.nodes) or slept
    if dest == slept and req.node == slept[0] and req.from_node in ("", slept[0]):
        _resume(pilot, req.node, slept[0], req.request_id)  # in place: every VM where it slept
        return True
    if dest == slept:  # one node named for the whole job (or the recovery's repeat): VM by VM
        from_ = f" from {req.from_node}" if req.from_node not in ("", req.node) else ""
        raise VjobError(_one_by_one(pilot, f"a resume on {req.node}{from_}"))
    what = f"a resume on {', '.join(dest)}"
    if len(dest) != len(slept) or len(set(dest)) != len(dest) or req.node != dest[0]:
        raise VjobError(
            f"VM {pilot.vm.name}: {what} refused: a job of {len(slept)} VMs (asleep on {', '.join(slept)}) is "
            f"resumed with one distinct node per VM, the first being the request's node ({req.node})"
        )
    why = getattr(pilot.vm, "movable", lambda: "")()
    if why:
        raise VjobError(_one_by_one(pilot, what, why))
    pilot.say(f"resuming the job's {len(slept)} VMs on {', '.join(dest)} (slept on {', '.join(slept)})")
    pilot.set_state(PilotState.RESTORING)
    t0 = time.monotonic()
    try:
        pilot.vm.move(dest)  # type: ignore[attr-defined]
    except MoveRolledBack as exc:  # every VM runs where it slept: the pilot watches it again
        pilot.set_state(PilotState.RUNNING, node=pilot.vm.node, uri=pilot.vm.uri, memory_path="")
        pilot.say(f"move refused: {exc}")
        _refuse(pilot, req.request_id, f"VM {pilot.vm.name}: {what}: {exc}")
        return False
    except VjobError:
        pilot.set_state(PilotState.SAVED)  # nothing runs: still asleep, states where the error says
        raise
    took = time.monotonic() - t0
    _moved_to(pilot, pilot.vm.node)
    st = pilot.status
    pilot.set_state(
        PilotState.RUNNING,
        node=pilot.vm.node,
        uri=pilot.vm.uri,
        member_nodes=list(pilot.vm.nodes()),
        memory_path="",
        restores=st.restores + 1,
        restore_seconds=took,
        request_id=req.request_id,
        request_error="",
    )
    pilot.log.info("job moved", nodes=list(pilot.vm.nodes()), slept=slept, seconds=round(took, 3))
    return True


def _migrate(pilot: SwitchedPilot, req: CheckpointRequest) -> None:
    src = pilot.vm.node
    if len(pilot.vm.nodes()) > 1:
        raise VjobError(_one_by_one(pilot, f"a live migration to {req.node}"))
    pilot.say(f"migrating VM {pilot.vm.name} live from {src} to {req.node}")
    pilot.vm.driver.migrate(pilot.vm.name, src, req.node)
    _moved_to(pilot, req.node)
    pilot.set_state(PilotState.RUNNING, node=req.node, uri=pilot.vm.uri, request_id=req.request_id, request_error="")
    pilot.log.info("migrated", source=src, destination=req.node)


def _one_by_one(pilot: SwitchedPilot, what: str, why: str = "") -> str:
    """Why a multi-node job refuses to move: its VMs are one job whose snapshot is one
    consistent cut (provisioning.coordinated); moving one VM (its leader) while the others stay
    would split it — it moves whole, by a resume naming a node per VM, or `why` not at all."""
    how = f"and cannot be moved at all here: {why}" if why else "it is not moved VM by VM"
    return (
        f"VM {pilot.vm.name}: {what} refused: a multi-node job (VMs on {', '.join(pilot.vm.nodes())}) is "
        f"suspended, resumed and stopped as a whole, {how} (checkpoint it and let the resource "
        "manager requeue it to place it elsewhere)"
    )


def _stop(pilot: SwitchedPilot, request_id: str) -> int:
    """The vjob is terminated by the plan: its VM (running or asleep) is deleted, the job ends."""
    pilot.say(f"stopped by a context switch: deleting VM {pilot.vm.name}")
    pilot.vm.delete()
    pilot.set_state(PilotState.FINISHED, memory_path="", request_id=request_id, request_error="")
    return EXIT_STOPPED


def _moved_to(pilot: SwitchedPilot, node: str) -> None:
    """The VM now lives on `node`: the pilot's handle and the output copy follow it there."""
    pilot.vm.node = node
    pilot.vm.uri = pilot.vm.driver.uri(node)
    pilot.retail()
