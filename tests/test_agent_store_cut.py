"""The database cut in the middle of a switch (issue 39, "Tests that would have caught these").

Checked by hand, in-process, until now. Here the agent's real switch path (planner, executor,
journal, lease keeper, pilot files; the stand-in pilot of tests/test_agent_lease_switch.py)
talks to a real PostgreSQL through a TCP relay the test cuts while the switch waits for the
victim's save: new connections are refused and open ones reset, as when the database host or
its network goes away. The agent must neither crash (at most the StoreError its tick handles
escapes) nor lose or falsify the journal entry written before the cut; once the database is
back, the recovery the next tick runs finishes the switch (the pilot saved) or undoes it (it
did not), with the job requeue-held exactly once and its preemption counted once.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from agent.loop import Agent
from agent.metrics import AgentMetrics
from tests.services import free_port, wait_for
from tests.stand_ins import HoldingAdapter
from tests.test_agent_lease_switch import JOB, _observation, _pilot, _preempt, _ready
from vjob.config import parse
from vjob.errors import StoreError
from vjob.model import Job, JobClass, JobState, Node
from vjob.store import jobs as store_jobs
from vjob.store import journal
from vjob.store.db import Store

pytestmark = pytest.mark.postgres


class Relay:
    """A TCP relay to the database that the test can cut (refuse and reset) and restore."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Refuse new connections and reset every open one (SO_LINGER 0: an RST, not a FIN)."""
        if self._listener is not None:
            with contextlib.suppress(OSError):  # a close alone leaves a blocked accept() listening
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()
            self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()


class _Adapter(HoldingAdapter):
    """The RMS as recovery asks it: the job runs until requeue-held, then it is pending."""

    def jobs(self) -> list[Job]:
        state = JobState.PENDING if JOB in self.held else JobState.RUNNING
        return [
            Job(
                id=JOB,
                user="root",
                job_class=JobClass.BATCH,
                rms="slurm",
                memory_mb=1024,
                state=state,
                allocated_nodes=() if JOB in self.held else ("n1",),
            )
        ]

    def nodes(self) -> list[Node]:
        return [Node("n1", 64, 1 << 20)]


@pytest.fixture
def relayed(postgres_url: str) -> Iterator[tuple[Relay, str, Store]]:
    """(the relay, the database's URL through it, a direct store for the test's own reads)."""
    direct = Store(postgres_url)
    direct.upgrade()
    parts = urlsplit(postgres_url)
    relay = Relay((parts.hostname or "127.0.0.1", parts.port or 5432))
    relay.start()
    netloc = f"{parts.username}:{parts.password}@127.0.0.1:{relay.port}"
    try:
        yield relay, urlunsplit(parts._replace(netloc=netloc)), direct
    finally:
        relay.cut()
        direct.close()


def _agent(url: str, tmp_path: Path) -> tuple[Agent, _Adapter, Store]:
    agent_cfg = {"pilot_dir": str(tmp_path / "pilots"), "lease_s": 5, "checkpoint_timeout_s": 600}
    cfg = parse({"data_dir": str(tmp_path / "data"), "agent": agent_cfg})
    adapter = _Adapter()
    agent = Agent(cfg, adapter, rms="slurm", metrics=AgentMetrics(), owner="A")  # type: ignore[arg-type]
    store = Store(url, connect_timeout_s=2)
    agent.ports.store.opened = store
    return agent, adapter, store


@pytest.mark.parametrize(
    "saved",
    ["while cut", "after the agent gave up", "never"],
)
def test_a_switch_cut_off_from_its_database_is_kept_and_recovered(
    relayed: tuple[Relay, str, Store], tmp_path: Path, saved: str
) -> None:
    relay, url, direct = relayed
    agent, adapter, store = _agent(url, tmp_path)
    obs, st = _observation(1024)
    pdir = _ready(store, agent, obs, st, tmp_path)
    save = threading.Event()
    outcome: dict[str, Any] = {}

    def a_switch() -> None:
        try:
            outcome["done"] = _preempt(agent, obs)
        except StoreError as exc:  # what the tick catches (Agent._act_tick): not a crash
            outcome["store_error"] = str(exc)
        except BaseException as exc:  # noqa: BLE001 - anything else would stop the agent's loop: recorded
            outcome["crash"] = repr(exc)

    try:
        with _pilot(pdir, st, tmp_path, save.is_set) as seen:
            t = threading.Thread(target=a_switch, daemon=True)
            t.start()
            wait_for(lambda: bool(seen), 60, "the checkpoint request")
            (before,) = journal.open_switches(direct, rms="slurm")
            assert [a.state for a in before.actions] == ["running"]
            relay.cut()
            if saved == "while cut":
                save.set()
            # else the lease runs out unrenewed: the agent stops and leaves the switch as it is
            t.join(timeout=120)
            assert not t.is_alive(), "the agent still waits, cut off from its database"
            if saved != "while cut":
                assert outcome == {"done": []}, "the switch was not left to the lease's next holder"
            if saved == "after the agent gave up":
                save.set()
                wait_for(lambda: pdir.read_state().state.value == "saved", 60, "the pilot's save")  # type: ignore[union-attr]
        assert "crash" not in outcome, outcome["crash"]
        (kept,) = journal.open_switches(direct, rms="slurm")  # nothing written, nothing lost
        assert (kept.id, [a.state for a in kept.actions]) == (before.id, ["running"])

        relay.start()  # the database is back: the next tick takes the lease and recovers
        assert agent.ports.lease.hold()
        assert agent._recovered is False, "the next tick would not look at the journal"
        assert agent.recover() == [kept.id]
    finally:
        store.close()
    assert journal.open_switches(direct, rms="slurm") == []
    (closed,) = journal.recent(direct, limit=1)
    record = store_jobs.get(direct, "slurm", JOB)
    assert record is not None
    if saved == "never":
        assert (closed.state, [a.state for a in closed.actions]) == ("rolled_back", ["undone"])
        assert adapter.held == [] and record.preempt_count == 0
        assert pdir.read_request() is None, "the undone switch's request was left for the pilot"
    else:
        assert (closed.state, [a.state for a in closed.actions]) == ("done", ["done"])
        assert adapter.held == [JOB], "requeue-held twice, or never"
        assert record.preempt_count == 1
