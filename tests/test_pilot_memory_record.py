"""The agent's view of a saved VM is the pilot's record, the node's view is the file.

A job whose VMs live in a directory of the node's own (`[provisioning] user_vm_dir`, any
`vm_dir` the controller does not mount) is saved into a path that is no file on the controller,
where the agent runs. The agent used to look for that file (PilotStatus.memory_saved did
os.path.exists): every checkpoint of such a job waited for a save the pilot had long finished,
timed out and was withdrawn. Now the agent trusts what the pilot wrote with the path (the save's
byte count, measured by the driver where the state was saved); the pilot, on its node, still
asks whether the file is there before it restores instead of booting.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from agent import act
from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.observe import Observation
from agent.pause_checkpoint import _answer
from preemption.scheduling.tick import Preemption
from tests.stand_ins import HoldingAdapter
from vjob.config import parse
from vjob.model import ClusterView, Job, JobClass, JobState, Node, VJobState
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, RequestKind
from vjob.store import jobs as store_jobs
from vjob.store import journal
from vjob.store.db import Store

JOB = "81"
NODE_LOCAL = "/var/tmp/vjob-users/vjrun/vms/vjob-slurm-81.state"
"""Where host A's user_vm_dir put the state: a directory of that host, not of this one."""


def _running() -> PilotStatus:
    return PilotStatus(
        job_id=JOB,
        vm=f"vjob-slurm-{JOB}",
        node="n1",
        uri="qemu:///session",
        state=PilotState.RUNNING,
        since=time.time(),
        memory_mb=512,
        image="debian12",
    )


def _saved(request_id: str = "r1", **changes: object) -> PilotStatus:
    st = _running().moved(PilotState.SAVED, request_id=request_id, saved_node="n1", memory_path=NODE_LOCAL)
    return st.moved(PilotState.SAVED, **{"save_bytes": 300 << 20, **changes})


def _job() -> Job:
    now = time.time()
    return Job(
        id=JOB,
        user="root",
        job_class=JobClass.BATCH,
        rms="slurm",
        memory_mb=512,
        state=JobState.RUNNING,
        allocated_nodes=("n1",),
        start_time=now - 60,
        submit_time=now - 120,
    )


def test_the_path_is_not_here_yet_the_agent_sees_the_vm_saved(tmp_path: Path) -> None:
    assert not Path(NODE_LOCAL).exists()
    pdir = PilotDir(tmp_path / "pilots", "slurm", JOB)
    pdir.ensure()
    pdir.write_state(_saved())
    st = pdir.read_state()
    assert st is not None and st.memory_saved and not st.memory_on_this_host
    assert pdir.saved_for("r1") and pdir.answer_to("r1") == st  # the checkpoint and the suspend's answers
    assert _answer(pdir, "r1", PilotState.SAVED) == st  # the pause-first checkpoint's
    view = ClusterView(now=time.time(), jobs=(_job(),), nodes=(Node("n1", 4, 4096),))
    obs = Observation(view=view, pilots={JOB: st}, sleeping={}, store_ok=True)
    with_vms, target = act._vm_view(obs, set())
    assert [(vm.name, vm.node, vm.state.value) for vm in with_vms.vms] == [(f"vjob-slurm-{JOB}", "n1", "saved")]
    assert target == {JOB: VJobState.SLEEPING}


def test_a_restored_vm_or_a_save_of_nothing_is_not_saved(tmp_path: Path) -> None:
    """The restore clears the path (the byte count stays, from the last save); a record with a
    path but no byte count is judged by the file, here absent."""
    restored = _saved().moved(PilotState.RUNNING, memory_path="")
    assert restored.save_bytes > 0 and not restored.memory_saved
    assert not _saved(save_bytes=0).memory_saved
    here = tmp_path / "vjob-slurm-81.state"
    here.write_bytes(b"state")
    assert _saved(save_bytes=0, memory_path=str(here)).memory_saved  # as before: the file, seen here


def test_a_state_file_of_the_former_pilot_reads_the_same(tmp_path: Path) -> None:
    """The former pilot wrote the byte count with the path in the same write (pilot.Pilot.save,
    pilot.pause_drain): its files need no new key. A file with no byte count at all (none of the
    pilot's) falls back to the file check, as before; a count of another type is refused."""
    pdir = PilotDir(tmp_path / "pilots", "slurm", JOB)
    pdir.ensure()
    former = {k: v for k, v in _saved().to_json().items() if k not in ("history",)}
    pdir.state_file.write_text(json.dumps(former))
    st = pdir.read_state()
    assert st is not None and st.memory_saved and pdir.saved_for("r1")
    del former["save_bytes"]
    pdir.state_file.write_text(json.dumps(former))
    st = pdir.read_state()
    assert st is not None and st.save_bytes == 0 and not st.memory_saved and not pdir.saved_for("r1")
    pdir.state_file.write_text(json.dumps({**former, "save_bytes": "300M"}))
    try:
        pdir.read_state()
    except Exception as exc:  # noqa: BLE001 - the refusal is what is checked
        assert "save_bytes" in str(exc)
    else:
        raise AssertionError("a byte count that is text was read")


@contextlib.contextmanager
def _node_local_pilot(pdir: PilotDir) -> Iterator[list[str]]:
    """A pilot on host A: it answers a checkpoint with its state saved into host A's own
    directory, a path the controller cannot see (nothing is written here)."""
    seen: list[str] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(0.05):
            req = pdir.read_request()
            if req is None or req.kind is not RequestKind.CHECKPOINT:
                continue
            seen.append(req.request_id)
            st = pdir.read_state()
            assert st is not None
            pdir.write_state(
                st.moved(
                    PilotState.SAVED,
                    request_id=req.request_id,
                    saved_node=st.node,
                    memory_path=NODE_LOCAL,
                    save_bytes=300 << 20,
                )
            )
            return

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield seen
    finally:
        stop.set()
        t.join(timeout=10)


def test_the_agents_checkpoint_of_a_node_local_vm_completes(tmp_path: Path) -> None:
    """The real agent's switch (planner, executor, journal, pilot files) against a pilot whose
    state is on its node's disk: requeue-held and journalled done. Before, it waited the whole
    checkpoint timeout for a file it could not see and withdrew the request."""
    cfg = parse(
        {
            "data_dir": str(tmp_path / "data"),
            "agent": {"pilot_dir": str(tmp_path / "pilots"), "checkpoint_timeout_s": 20},
        }
    )
    adapter = HoldingAdapter()
    store = Store(f"sqlite:///{tmp_path / 'vjob.sqlite'}")
    store.upgrade()
    with Agent(cfg, adapter, rms="slurm", metrics=AgentMetrics(), owner="A") as agent:  # type: ignore[arg-type]
        agent.ports.store.opened = store
        view = ClusterView(now=time.time(), jobs=(_job(),), nodes=(Node("n1", 64, 1 << 20),))
        obs = Observation(view=view, pilots={JOB: _running()}, sleeping={}, store_ok=True)
        store_jobs.track(store, _job())
        pdir = PilotDir(agent.ports.root, "slurm", JOB)
        pdir.ensure()
        pdir.write_state(_running())
        assert agent.ports.lease.hold()
        pre = Preemption(job_id="interactive", victims=(JOB,), nodes=("n1",), checkpoint_bytes=0.0)
        with _node_local_pilot(pdir) as seen, agent.ports.lease.keeping():
            done = act.preempt(agent.ports, pre, obs)
        assert done == [JOB] and adapter.held == [JOB] and len(seen) == 1
        (last,) = journal.recent(store, limit=1)
        assert last.state == "done"
        assert pdir.read_request() is not None  # answered, not withdrawn: the requeue ends the pilot
    store.close()
