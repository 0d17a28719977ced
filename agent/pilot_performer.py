"""The executor's performer for live context switches: every plan action as a pilot request.

Why through the pilots: each vjob's pilot owns its VM for the life of the job (pilot.pilot); the
agent never touches a VM behind its back. A suspend, a resume on a given node (local, or from
the state on another node), a live migration and a stop are requests in the vjob's pilot
directory (vjob.pilot_files.RequestKind), answered in its state file. A run is the RMS's to
do (it allocates and starts the job, whose pilot boots the VM): `start_job` asks it, and the
action is done when the pilot reports the VM running on the planned node.

A multi-node vjob's pilot holds all its VMs and takes one request for all of them: the loop
hands this performer a plan coalesced per pilot (agent.pilot_coalesce), whose one action on
the pilot's first VM stands for all; a suspend then names every node the job holds.

The request id is the action's journal key (preemption.executor.action_key): a restarted agent
that repeats an action finds it answered and waits for nothing twice (agent.recover).

Why a timeout per action and a lease check (issue 39, item 6): a save writes the VM's memory
(about 5 s per GiB), so a fixed wait withdrew a big VM's suspend mid-save; and an agent that
lost its lease kept waiting, then withdrew a request that was the new holder's to finish or
undo. `live_performer` gives every agent step (control loop, remap, recovery) the preemption
switch's rules: `checkpoint_timeout_for` per vjob, and Abandoned as soon as the lease
(agent.lease) no longer covers the switch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from agent.observe import Observation
from agent.ports import Ports
from preemption.executor import Abandoned, Executor
from preemption.planner.plan import PlanAction
from vjob.config import Config
from vjob.errors import VjobError
from vjob.model import Action
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, RequestKind

EXECUTOR_TAG = "pilot-requests"
"""The executor tag of live switches in the journal: agent.recover finishes them with this performer."""

T = TypeVar("T")


def wait_for(
    answer: Callable[[], T | None],
    *,
    timeout_s: float,
    poll_s: float,
    check_ours: Callable[[], None],
    timed_out: Callable[[], Exception],
) -> T:
    """Poll `answer` until it gives something, the one wait of every pilot request the agent
    makes (a preemption's checkpoint, a switch's actions): `check_ours` raises Abandoned once
    the lease is lost (the request stays, for the new holder), and past `timeout_s`
    `timed_out()` is raised (the caller withdraws what it must first)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = answer()
        if got is not None:
            return got
        check_ours()
        if time.monotonic() > deadline:
            raise timed_out()
        time.sleep(poll_s)


_KINDS = {
    Action.SUSPEND: RequestKind.SUSPEND,
    Action.RESUME: RequestKind.RESUME,
    Action.MIGRATE: RequestKind.MIGRATE,
    Action.STOP: RequestKind.STOP,
}


class PilotRequestPerformer:
    """preemption.executor.KeyedPerformer over the pilots' request files."""

    def __init__(
        self,
        pilot_dir: Callable[[PlanAction], PilotDir],
        *,
        timeout_s: float = 300.0,
        poll_s: float = 0.05,
        start_job: Callable[[PlanAction], None] | None = None,
        reason: str = "",
        timeout_for: Callable[[PlanAction], float] | None = None,
        still_ours: Callable[[], bool] | None = None,
    ) -> None:
        """`timeout_for`: how long to wait for the answer to one action (its VM's save time),
        `timeout_s` for every action without it. `still_ours`: whether the caller may still act
        (the agent's lease); when it turns False a wait stops with Abandoned and leaves the
        request in place, for the lease's new holder."""
        self.pilot_dir = pilot_dir
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.start_job = start_job
        self.reason = reason
        self.timeout_for = timeout_for or (lambda _a: timeout_s)
        self.still_ours = still_ours or (lambda: True)

    def perform(self, action: PlanAction, key: str) -> None:
        pdir = self.pilot_dir(action)
        if action.kind is Action.RUN:
            self._run(pdir, action)
            return
        kind = _KINDS[action.kind]
        node = (action.dst or "") if kind in (RequestKind.RESUME, RequestKind.MIGRATE) else ""
        from_node = (action.src or "") if kind is RequestKind.RESUME else ""
        st = _state(pdir)
        held = tuple(st.member_nodes) if st is not None and st.member_nodes else ()
        if st is None or st.request_id != key:  # a repeated action already answered is not asked again
            pdir.request(
                kind,
                key,
                node=node,
                from_node=from_node,
                reason=self.reason,
                nodes=held or ((action.src,) if action.src else ()),
            )
        answer = self._wait(pdir, key, action)
        if answer.request_error:
            raise VjobError(f"{action.kind.value} {action.vm}: the pilot refused: {answer.request_error}")
        expected = _expected(action)
        if answer.state is not expected or (expected is PilotState.RUNNING and answer.node != action.dst):
            where = f" on {action.dst}" if action.dst else ""
            raise VjobError(
                f"{action.kind.value} {action.vm}: the pilot answered {answer.state.value} on "
                f"{answer.node}, not {expected.value}{where}"
            )

    def _wait(self, pdir: PilotDir, key: str, action: PlanAction) -> PilotStatus:
        timeout = self.timeout_for(action)

        def timed_out() -> VjobError:
            if action.kind is Action.SUSPEND:
                pdir.withdraw_request()  # a pilot that saves anyway wakes its VM where it was
            return VjobError(
                f"{action.kind.value} {action.vm}: no answer from its pilot ({pdir.path}) within {timeout:.0f} s"
            )

        return wait_for(
            lambda: pdir.answer_to(key),
            timeout_s=timeout,
            poll_s=self.poll_s,
            check_ours=lambda: self._check_ours(action),
            timed_out=timed_out,
        )

    def _check_ours(self, action: PlanAction) -> None:
        """Stop waiting once the lease is lost: the request stays, the new holder's recovery
        finishes or undoes the action (agent.recover); withdrawing it here would undo a save
        under the new holder's feet."""
        if not self.still_ours():
            raise Abandoned(f"{action.kind.value} {action.vm}: the agent lease was lost waiting for its pilot")

    def _run(self, pdir: PilotDir, action: PlanAction) -> None:
        st = _state(pdir)
        if st is not None and st.state is PilotState.RUNNING and st.node == action.dst:
            return  # already running there (a run repeated after a crash)
        if self.start_job is None:
            raise VjobError(f"run {action.vm}: starting a vjob is the RMS's job, and no RMS start was given")
        t0 = time.time()
        self.start_job(action)
        timeout = self.timeout_for(action)

        def running() -> bool | None:
            st = _state(pdir)
            if st is not None and st.state is PilotState.FAILED and st.since >= t0:
                raise VjobError(f"run {action.vm}: its pilot failed: {st.message}")
            ok = st is not None and st.state is PilotState.RUNNING and st.node == action.dst and st.since >= t0
            return True if ok else None

        wait_for(
            running,
            timeout_s=timeout,
            poll_s=self.poll_s,
            check_ours=lambda: self._check_ours(action),
            timed_out=lambda: VjobError(f"run {action.vm}: not running on {action.dst} within {timeout:.0f} s"),
        )


def checkpoint_timeout_for(cfg: Config, obs: Observation, job_id: str) -> float:
    """How long a switch waits for this job's save: `[agent] checkpoint_timeout_s` plus
    `checkpoint_timeout_per_gib_s` per GiB of its VM, at most `checkpoint_timeout_max_s`.
    The VM's memory is its pilot's word (the user's), bounded by what the RMS allocated the
    job when it says: a claim cannot stretch the wait past the job's own allocation."""
    st = obs.pilots.get(job_id)
    claimed = st.memory_mb if st is not None else 0
    try:
        allocated = obs.view.job(job_id).memory_mb
    except KeyError:
        allocated = 0
    memory = min(claimed, allocated) if claimed and allocated else claimed or allocated
    return cfg.agent.checkpoint_timeout_for(memory)


def live_performer(ports: Ports, obs: Observation, reason: str) -> PilotRequestPerformer:
    """The performer of an agent's live switch (control loop, remap, recovery): requests in the
    pilot directories the agent believes, each action waiting as long as its vjob's save may
    take (checkpoint_timeout_for: the floor plus so much per GiB of the VM, capped; the same
    rule as the preemption switch's), and stopping once the agent's lease is lost."""
    return PilotRequestPerformer(
        lambda a: ports.pilot_dir(a.vjob),
        timeout_for=lambda a: checkpoint_timeout_for(ports.cfg, obs, a.vjob),
        still_ours=ports.lease.valid,
        reason=reason,
    )


def live_executor(ports: Ports, obs: Observation, reason: str) -> Executor:
    """The executor of a live switch of the control loop or the remap step: its actions are
    pilot requests (live_performer), journalled under EXECUTOR_TAG so that a restarted agent
    finishes them with the same performer (agent.recover)."""
    return ports.executor(live_performer(ports, obs, reason), tag=EXECUTOR_TAG)


def _expected(action: PlanAction) -> PilotState:
    if action.kind is Action.SUSPEND:
        return PilotState.SAVED
    if action.kind is Action.STOP:
        return PilotState.FINISHED
    return PilotState.RUNNING


def _state(pdir: PilotDir) -> PilotStatus | None:
    try:
        return pdir.read_state()
    except VjobError:
        return None
