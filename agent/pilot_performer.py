"""The executor's performer for live context switches: every plan action as a pilot request.

Why through the pilots: each vjob's pilot owns its VM for the life of the job (agent.pilot); the
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
"""

from __future__ import annotations

import time
from collections.abc import Callable

from preemption.planner.plan import PlanAction
from vjob.errors import VjobError
from vjob.model import Action
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, RequestKind

EXECUTOR_TAG = "pilot-requests"
"""The executor tag of live switches in the journal: agent.recover finishes them with this performer."""

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
    ) -> None:
        self.pilot_dir = pilot_dir
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.start_job = start_job
        self.reason = reason

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
            pdir.request(kind, key, node=node, from_node=from_node, reason=self.reason,
                         nodes=held or ((action.src,) if action.src else ()))  # fmt: skip
        answer = self._wait(pdir, key, action)
        if answer.request_error:
            raise VjobError(f"{action.kind.value} {action.vm}: the pilot refused: {answer.request_error}")
        expected = _expected(action)
        if answer.state is not expected or (expected is PilotState.RUNNING and answer.node != action.dst):
            where = f" on {action.dst}" if action.dst else ""
            raise VjobError(f"{action.kind.value} {action.vm}: the pilot answered {answer.state.value} on "
                            f"{answer.node}, not {expected.value}{where}")  # fmt: skip

    def _wait(self, pdir: PilotDir, key: str, action: PlanAction) -> PilotStatus:
        deadline = time.monotonic() + self.timeout_s
        while True:
            answer = pdir.answer_to(key)
            if answer is not None:
                return answer
            if time.monotonic() > deadline:
                if action.kind is Action.SUSPEND:
                    pdir.withdraw_request()  # a pilot that saves anyway wakes its VM where it was
                raise VjobError(f"{action.kind.value} {action.vm}: no answer from its pilot ({pdir.path}) within "
                                f"{self.timeout_s:.0f} s")  # fmt: skip
            time.sleep(self.poll_s)

    def _run(self, pdir: PilotDir, action: PlanAction) -> None:
        st = _state(pdir)
        if st is not None and st.state is PilotState.RUNNING and st.node == action.dst:
            return  # already running there (a run repeated after a crash)
        if self.start_job is None:
            raise VjobError(f"run {action.vm}: starting a vjob is the RMS's job, and no RMS start was given")
        t0 = time.time()
        self.start_job(action)
        deadline = time.monotonic() + self.timeout_s
        while True:
            st = _state(pdir)
            if st is not None and st.state is PilotState.RUNNING and st.node == action.dst and st.since >= t0:
                return
            if st is not None and st.state is PilotState.FAILED and st.since >= t0:
                raise VjobError(f"run {action.vm}: its pilot failed: {st.message}")
            if time.monotonic() > deadline:
                raise VjobError(f"run {action.vm}: not running on {action.dst} within {self.timeout_s:.0f} s")
            time.sleep(self.poll_s)


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
