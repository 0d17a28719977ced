"""A stand-in pilot and RMS for tests of the agent's live switches.

Why stand-ins here: the lease, recovery and store-cut tests exercise the agent's own paths (its
executor, journal, lease rows, request files) against a pilot that answers exactly when the test
says, which no real guest can do on cue; the real pilot and guests have their e2e tests.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from vjob.pilot_files import PilotDir, PilotState, RequestKind


class HoldingAdapter:
    """The RMS as a checkpoint asks it: the requeue-hold, recorded."""

    name = "slurm"

    def __init__(self) -> None:
        self.held: list[str] = []

    def requeue_hold(self, job_id: str) -> None:
        self.held.append(job_id)


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
