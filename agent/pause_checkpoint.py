"""The agent's side of a pause-first checkpoint: the victim's CPUs to the RMS at once, its
memory once it is on disk (docs/preempt-pause.md).

Why in this order: the pilot pauses the VM and answers `saving` (pilot.pause_drain) within a
second whatever the guest's size; the agent then suspends the job in the RMS (Slurm: `scontrol
suspend` releases its CPUs and keeps its memory allocated, so the RMS starts the interactive
job at once where the node's memory holds both, and nowhere else), waits for the pilot's
drainer to answer `saved`, and only then requeue-holds the job. The requeue kills whatever the
job still runs (on 22.05, a suspended job's processes get no SIGTERM first); nothing of the VM
is left by then: the save has ended and its QEMU with it.

When anything fails (no pause, no save within the VM's checkpoint timeout), the request is
withdrawn and the job resumed in the RMS (its pilot gets SIGCONT, sees the withdrawal and runs
its VM again): the same roll-back as a save-first checkpoint, plus the resume.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from agent.observe import Observation
from agent.pilot_performer import checkpoint_timeout_for, wait_for
from agent.ports import Ports
from preemption.executor import Abandoned
from vjob.errors import CommandError, VjobError
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, RequestKind

PAUSE_TIMEOUT_S = 60.0
"""How long the agent waits for the pause's answer (a pause does not grow with the memory);
bounded by `[agent] checkpoint_timeout_s` when that is shorter."""


_said: weakref.WeakKeyDictionary[Any, tuple[bool, str]] = weakref.WeakKeyDictionary()
"""Adapter → the answer `enabled` last logged for it: one line when it changes, not per victim."""


def usable(ports: Ports, obs: Observation, job_id: str) -> bool:
    """Whether this victim is checkpointed pause-first: the vjob is one VM (a multi-node vjob
    is saved as one cut by its pilot, provisioning.coordinated) and `enabled` says so."""
    st = obs.pilots.get(job_id)
    return st is not None and not st.member_nodes and enabled(ports)[0]


def enabled(ports: Ports) -> tuple[bool, str]:
    """Whether victims are checkpointed pause-first now, and why: `[agent] pause_first`, where
    "auto" asks the RMS whether its suspend lets the drainer run (Slurm: ProctrackType, read
    from the controller once and again when a minute old, plugins.slurm.proctrack). The agent
    calls it when it starts, so the site reads the answer once in its log; again when it
    changes."""
    setting = ports.cfg.agent.pause_first
    abilities = ports.adapter.abilities
    if setting is False:
        answer = (False, "[agent] pause_first = false")
    elif not (abilities.suspend and abilities.cpu_handover):
        answer = (False, f"{ports.adapter.name} cannot hand a suspended job's CPUs over while it keeps its memory")
    elif setting is True:
        answer = (True, "[agent] pause_first = true")
    else:
        try:
            answer = ports.adapter.suspend_spares_detached()
        except CommandError as exc:
            answer = (False, f"cannot read how the RMS suspends a job: {exc}")
    if _said.get(ports.adapter) != answer:
        _said[ports.adapter] = answer
        say = ports.log.info if answer[0] or setting is False else ports.log.warning
        say(f"pause-first preemption {'on' if answer[0] else 'off (save-first)'}", why=answer[1], setting=setting)
    return answer


class DrainNotice:
    """The interactive job's wait reason while its victims drain, written once for all of
    them and taken back when the switch ends (the RMS's field, agent.wait_notice's format)."""

    def __init__(self, ports: Ports, job_id: str, text: str | None) -> None:
        self.ports = ports
        self.job_id = job_id
        self.text = text
        self.told = False
        self._lock = threading.Lock()

    def tell(self) -> None:
        """After a victim's CPUs were handed over: say why the job still waits, if it must."""
        with self._lock:
            if self.told or self.text is None or self.ports.adapter.abilities.wait_field is None:
                return
            try:
                self.ports.adapter.tell_wait(self.job_id, self.text)
                self.told = True
            except (CommandError, VjobError) as exc:
                self.ports.log.warning("could not tell why the job waits", jobs=[self.job_id], error=str(exc))

    def take_back(self) -> None:
        with self._lock:
            if not self.told:
                return
            try:
                self.ports.adapter.tell_wait(self.job_id, None)
                self.told = False
            except (CommandError, VjobError) as exc:
                self.ports.log.warning("could not remove the wait reason", jobs=[self.job_id], error=str(exc))


def checkpoint(ports: Ports, obs: Observation, job_id: str, vm: str, reason: str, notice: DrainNotice | None) -> None:
    """Pause, suspend in the RMS, wait for the save, leave the requeue-hold to the caller
    (act.finish_checkpoint); VjobError (request withdrawn, job resumed) when it fails."""
    pdir = ports.pilot_dir(job_id)
    request_id = f"{vm}@{time.time():.6f}"
    nodes = obs.view.job(job_id).allocated_nodes
    pdir.request(RequestKind.PAUSE_CHECKPOINT, request_id, reason=reason, nodes=nodes)
    timeout = checkpoint_timeout_for(ports.cfg, obs, job_id)
    check_ours = _check_ours(ports, job_id, vm)
    suspended = False
    try:
        t0 = time.monotonic()
        paused = _wait(
            lambda: _answer(pdir, request_id, PilotState.SAVING),
            min(PAUSE_TIMEOUT_S, timeout),
            check_ours,
            f"job {job_id}: VM {vm} not paused",
        )
        _refused(job_id, vm, paused)
        ports.log.info("victim paused", jobs=[job_id], seconds=round(time.monotonic() - t0, 3))
        try:
            ports.adapter.suspend(job_id)  # CPUs free now; memory still allocated until the requeue
            suspended = True
            if notice is not None:
                notice.tell()
        except CommandError as exc:  # the job keeps its CPUs until the save ends: slower, not wrong
            ports.metrics.errors.labels(kind="rms").inc()
            ports.log.warning("could not suspend the paused victim", jobs=[job_id], error=str(exc))
        saved = _wait(
            lambda: _answer(pdir, request_id, PilotState.SAVED), timeout, check_ours, f"job {job_id}: VM {vm} not saved"
        )
        _refused(job_id, vm, saved)
    except Abandoned:
        raise  # the lease's new holder finishes or undoes it (agent.recover)
    except VjobError:
        pdir.withdraw_request()  # the pilot runs its VM again once it can (SIGCONT below)
        if suspended:
            _resume(ports, job_id)
        raise


def _wait(
    answer: Callable[[], PilotStatus | None], timeout: float, check_ours: Callable[[], None], what: str
) -> PilotStatus:
    return wait_for(
        answer,
        timeout_s=timeout,
        poll_s=0.05,
        check_ours=check_ours,
        timed_out=lambda: VjobError(f"{what} within {timeout:.0f} s; request withdrawn"),
    )


def _answer(pdir: PilotDir, request_id: str, state: PilotState) -> PilotStatus | None:
    """The pilot's state once it answered `request_id` with `state` (or later), or refused it."""
    try:
        st = pdir.read_state()
    except VjobError:
        return None
    if st is None or st.request_id != request_id:
        return None
    if st.request_error:
        return st
    if state is PilotState.SAVING and st.state in (PilotState.SAVING, PilotState.SAVED):
        return st
    return st if st.state is PilotState.SAVED and st.memory_saved else None


def _refused(job_id: str, vm: str, st: PilotStatus) -> None:
    if st.request_error:
        raise VjobError(f"job {job_id}: the pilot of VM {vm} refused the pause checkpoint: {st.request_error}")


def _check_ours(ports: Ports, job_id: str, vm: str) -> Callable[[], None]:
    def check() -> None:
        if not ports.lease.valid():
            raise Abandoned(f"job {job_id}: the agent lease was lost waiting for VM {vm}'s pause checkpoint")

    return check


def _resume(ports: Ports, job_id: str) -> None:
    try:
        ports.adapter.resume(job_id)
    except CommandError as exc:
        ports.metrics.errors.labels(kind="rms").inc()
        ports.log.error("could not resume the suspended victim", jobs=[job_id], error=str(exc))


__all__ = ["PAUSE_TIMEOUT_S", "DrainNotice", "checkpoint", "enabled", "usable"]
