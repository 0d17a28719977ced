"""A stand-in pilot and RMS for tests of the agent's live switches.

Why stand-ins here: the lease, recovery and store-cut tests exercise the agent's own paths (its
executor, journal, lease rows, request files) against a pilot that answers exactly when the test
says, which no real guest can do on cue; the real pilot and guests have their e2e tests.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from plugins.slurm.environment import ENVIRONMENT
from vjob.model import Job, JobState
from vjob.pilot_files import PilotDir, PilotState, RequestKind
from vjob.rms import Abilities, PriorityKnob


class HoldingAdapter:
    """The RMS as a checkpoint asks it: the requeue-hold, recorded. It declares no suspend
    (vjob.rms.Abilities), so its victims are checkpointed save-first."""

    name = "slurm"
    abilities = Abilities(
        priority=PriorityKnob(0, 1000),
        requeue_hold=True,
        hold_release=True,
        suspend=False,
        pin_nodes=False,
        start_now=False,
        environment=ENVIRONMENT,
    )

    def __init__(self) -> None:
        self.held: list[str] = []

    def requeue_hold(self, job_id: str) -> None:
        self.held.append(job_id)


class SuspendingAdapter(HoldingAdapter):
    """An RMS that suspends as Slurm does (vjob.rms.RMSAdapter's suspend, resume and
    suspend_spares_detached, with `cpu_handover`): the jobs as a table each call changes, every
    call recorded in order."""

    abilities = replace(HoldingAdapter.abilities, suspend=True, cpu_handover=True)

    def __init__(
        self, jobs: tuple[Job, ...], spares: tuple[bool, str] = (True, "stand-in: proctrack/linuxproc")
    ) -> None:
        super().__init__()
        self.table = {j.id: j for j in jobs}
        self.calls: list[tuple[str, str]] = []
        self.spares = spares

    def jobs(self) -> list[Job]:
        return list(self.table.values())

    def _set(self, verb: str, job_id: str, state: JobState) -> None:
        self.calls.append((verb, job_id))
        self.table[job_id] = replace(self.table[job_id], state=state)

    def suspend(self, job_id: str) -> None:
        self._set("suspend", job_id, JobState.SUSPENDED)

    def resume(self, job_id: str) -> None:
        self._set("resume", job_id, JobState.RUNNING)

    def requeue_hold(self, job_id: str) -> None:
        super().requeue_hold(job_id)
        self._set("requeue_hold", job_id, JobState.HELD)

    def suspend_spares_detached(self) -> tuple[bool, str]:
        return self.spares


@contextlib.contextmanager
def pausing_pilot(pdir: PilotDir, save_when: Callable[[], bool], memory: Path) -> Iterator[list[str]]:
    """A pilot answering a `pause_checkpoint` as pilot.pause_drain does: `saving` at once (the VM
    paused), `saved` (its state at `memory`) once `save_when()` holds — its drainer's answer —
    and, when the request is withdrawn after either, running again (the VM unpaused or
    restored). Yields what it did, in order ("saving", "saved", "running"); its state file
    must exist already."""
    done: list[str] = []
    stop = threading.Event()

    def run() -> None:
        rid = ""
        while not stop.wait(0.05):
            req = pdir.read_request()
            st = pdir.read_state()
            assert st is not None
            if req is not None and req.kind is RequestKind.PAUSE_CHECKPOINT and not rid:
                rid = req.request_id
                pdir.write_state(st.moved(PilotState.SAVING, request_id=rid))
                done.append("saving")
            elif rid and req is None:  # withdrawn: pilot.pause_drain._run_again
                pdir.write_state(st.moved(PilotState.RUNNING, memory_path=""))
                done.append("running")
                return
            elif rid and "saved" not in done and save_when():
                memory.write_bytes(b"saved")
                pdir.write_state(st.moved(PilotState.SAVED, memory_path=str(memory)))
                done.append("saved")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield done
    finally:
        stop.set()
        t.join(timeout=10)


@contextlib.contextmanager
def answering_pilot(pdir: PilotDir, answer_when: Callable[[], bool], memory: Path) -> Iterator[list[str]]:
    """A pilot that carries out the agent's request once `answer_when()` holds (a checkpoint or
    suspend: saved, its state at `memory`; a migration or resume: running on the requested
    node), then stops; yields the request ids it saw. Its state file must exist already."""
    seen: list[str] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(0.05):
            req = pdir.read_request()
            if req is None:
                continue
            if req.request_id not in seen:
                seen.append(req.request_id)
            if not answer_when():
                continue
            st = pdir.read_state()
            assert st is not None
            if req.kind in (RequestKind.CHECKPOINT, RequestKind.SUSPEND):
                memory.write_bytes(b"saved")
                pdir.write_state(st.moved(PilotState.SAVED, request_id=req.request_id, memory_path=str(memory)))
            else:
                pdir.write_state(st.moved(PilotState.RUNNING, request_id=req.request_id, node=req.node))
            return

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield seen
    finally:
        stop.set()
        t.join(timeout=10)
