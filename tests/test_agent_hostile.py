"""The root agent against a hostile job user (issue 23, items 2, 3 and 6).

A pilot runs as the job's user, so its directory and state.json are the user's: the agent reads
them as data (no symlink, regular file, size limit, typed fields), writes its request without
following anything planted there, never lets a state file name the VM it deletes or the time it
waits, and two agents never act on one cluster (a lease) nor one RMS's agent on another's switch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.loop import Agent
from agent.metrics import AgentMetrics
from tests.services import wait_for
from vjob.config import parse
from vjob.errors import InputError
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, all_dirs
from vjob.store import journal, leases
from vjob.store.db import Store

REPO = Path(__file__).resolve().parents[1]


def _status(pdir: PilotDir, **changes: object) -> dict[str, object]:
    st = PilotStatus(job_id=pdir.job_id, vm=pdir.vm, node="node1", uri="qemu:///system",
                     state=PilotState.SAVED, since=time.time())  # fmt: skip
    return {**st.to_json(), **changes}


@pytest.fixture
def pdir(tmp_path: Path) -> PilotDir:
    d = PilotDir(tmp_path / "pilots", "slurm", "4242")
    d.ensure()
    return d


@pytest.mark.parametrize(
    ("field", "value"),
    [("since", None), ("since", float("inf")), ("since", "yesterday"), ("memory_mb", -1), ("vm", "x; rm -rf /"),
     ("state", "pwned"), ("saved_nodes", "node1"), ("history", [1] * 5), ("node", "a\nb")],
)  # fmt: skip
def test_a_state_file_with_a_bad_field_is_an_input_error_naming_it(pdir: PilotDir, field: str, value: object) -> None:
    data = _status(pdir, **{field: value})
    pdir.state_file.write_text(json.dumps(data).replace("Infinity", "1e999"))
    with pytest.raises(InputError, match=field):
        pdir.read_state()


def test_a_fifo_as_state_file_does_not_hang_the_agent(pdir: PilotDir) -> None:
    os.mkfifo(pdir.state_file)
    t0 = time.monotonic()
    with pytest.raises(InputError, match="not a regular file"):
        pdir.read_state()
    assert time.monotonic() - t0 < 5


def test_a_symlinked_or_huge_state_file_is_refused(pdir: PilotDir, tmp_path: Path) -> None:
    secret = tmp_path / "root-only.json"
    secret.write_text(json.dumps(_status(pdir)))
    pdir.state_file.symlink_to(secret)
    with pytest.raises(InputError, match="cannot be read safely"):
        pdir.read_state()
    pdir.state_file.unlink()
    pdir.state_file.write_text(json.dumps({**_status(pdir), "message": "x" * 300_000}))
    with pytest.raises(InputError, match="limit"):
        pdir.read_state()


def test_a_symlinked_pilot_directory_is_not_listed(tmp_path: Path) -> None:
    root = tmp_path / "pilots"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "state.json").write_text("{}")
    root.mkdir()
    (root / "slurm-7").symlink_to(elsewhere)
    assert all_dirs(root, "slurm") == []


def test_root_never_writes_through_a_planted_symlink(pdir: PilotDir, tmp_path: Path) -> None:
    victim = tmp_path / "etc-shadow"
    victim.write_text("root:secret\n")
    pdir.request_file.symlink_to(victim)
    # The old predictable temporary name, planted too.
    (pdir.path / f".request.json.{os.getpid()}.tmp").symlink_to(victim)
    pdir.request_checkpoint("r1", reason="test")
    assert victim.read_text() == "root:secret\n"
    assert not pdir.request_file.is_symlink()
    assert pdir.read_request() is not None and pdir.read_request().request_id == "r1"


def test_a_directory_owned_by_another_user_is_refused(pdir: PilotDir) -> None:
    os.chown(pdir.path, 65534, 65534)  # nobody: not the job's user (root here)
    with pytest.raises(InputError, match="not by the job's user"):
        pdir.check_owner("root")
    pdir.check_owner("nobody")


def test_two_agents_one_lease(store: Store) -> None:
    """A standby never acts: it does not even look at the journal of the active agent."""
    cfg = parse({"agent": {"lease_s": 30}})
    assert leases.acquire(store, "agent:slurm", "A", 30)
    action = journal.PlannedAction(0, "suspend", "vjob-slurm-1", "slurm:1", "n1", None)
    switch_id, _ = journal.open_switch(store, "A's switch", {}, [action])
    b = Agent(cfg, _NeverCalled(), rms="slurm", metrics=AgentMetrics())
    b._store = store  # the shared store of both agents
    report = b.tick()
    assert report.active is False
    assert journal.load(store, switch_id).state == "running", "the standby must not roll back A's switch"
    # A PBS agent on the same store holds its own lease and never sees the Slurm switch.
    assert journal.open_switches(store, rms="pbs") == []
    assert [sw.id for sw in journal.open_switches(store, rms="slurm")] == [switch_id]


def test_a_lease_passes_only_when_it_runs_out(store: Store) -> None:
    t = 1000.0
    assert leases.acquire(store, "agent:pbs", "A", 10, at=t)
    assert not leases.acquire(store, "agent:pbs", "B", 10, at=t + 9)
    assert leases.acquire(store, "agent:pbs", "A", 10, at=t + 9), "the holder renews"
    assert not leases.acquire(store, "agent:pbs", "B", 10, at=t + 18)
    assert leases.acquire(store, "agent:pbs", "B", 10, at=t + 19.5), "expired: the standby takes it"
    assert leases.holder(store, "agent:pbs", at=t + 20) == "B"
    leases.release(store, "agent:pbs", "A")  # not A's any more: nothing happens
    assert leases.holder(store, "agent:pbs", at=t + 20) == "B"


def test_many_candidates_race_for_one_lease(store: Store) -> None:
    winners: list[str] = []
    barrier = threading.Barrier(8)

    def candidate(name: str) -> None:
        barrier.wait()
        if leases.acquire(store, "agent:race", name, 60):
            winners.append(name)

    threads = [threading.Thread(target=candidate, args=(f"c{i}",)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(winners) == 1


class _NeverCalled:
    """An adapter a standby must never touch (observing would already be acting on the RMS)."""

    name = "slurm"

    @property
    def abilities(self):
        raise AssertionError("the standby asked its adapter for something")

    def __getattr__(self, name: str):
        raise AssertionError(f"the standby called {name}")


@pytest.mark.slurm
def test_a_standby_agent_takes_over_when_the_active_one_is_killed(slurm_cluster, tmp_path: Path) -> None:
    config = tmp_path / "vjob.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n[agent]\ninterval_s = 1\nlease_s = 5\n'
                      f'[slurm]\nconf = "{slurm_cluster.conf}"\n')  # fmt: skip
    env = {**os.environ, **slurm_cluster.env, "VJOB_CONFIG": str(config)}
    subprocess.run([sys.executable, "-m", "vjob.cli", "db", "upgrade"], env=env, check=True, capture_output=True)
    store = Store(f"sqlite:///{tmp_path / 'data' / 'vjob.sqlite'}")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "vjob.cli", "agent", "--rms", "slurm"],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    try:
        wait_for(lambda: leases.holder(store, "agent:slurm") is not None, 60, "an active agent")
        first = leases.holder(store, "agent:slurm")
        assert first is not None
        active = next(p for p in procs if f":{p.pid}:" in first)
        active.kill()
        active.wait()
        t0 = time.monotonic()
        wait_for(lambda: (leases.holder(store, "agent:slurm") or first) != first, 60, "the standby taking over")
        took = time.monotonic() - t0
        standby = next(p for p in procs if p is not active)
        assert f":{standby.pid}:" in (leases.holder(store, "agent:slurm") or "")
        assert took < 5 + 5 + 2, f"took over after {took:.1f} s (lease 5 s, standby polls every 5/3 s)"
    finally:
        for p in procs:
            p.kill()
            p.wait()


DOMAIN_XML = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
<os><type arch='x86_64'>hvm</type></os></domain>"""


@pytest.mark.slurm
@pytest.mark.libvirt
def test_a_forged_state_file_never_makes_the_agent_delete_a_vm(slurm_cluster, slurm_adapter, libvirt_system,
                                                               tmp_path: Path) -> None:  # fmt: skip
    """The reproduced attack: a finished job's directory names another job's VM, with `since` far
    in the past. The agent ignores the file (its VM name is derived from the job id), waits
    cleanup_after_s by its own clock, and deletes only VMs the store records for that job."""
    import libvirt  # heavy: libvirt-python, this test's real target

    victim_vm = "vjob-slurm-777001"
    conn = libvirt.open(libvirt_system)
    dom = conn.defineXML(DOMAIN_XML.format(name=victim_vm))
    try:
        cfg = parse({"data_dir": str(tmp_path / "data"), "agent": {"cleanup_after_s": 3600},
                     "provisioning": {"default_uri": libvirt_system}})  # fmt: skip
        Store(cfg.database_url).upgrade()
        root = cfg.data_path / "pilots"
        forged = PilotDir(root, "slurm", "777002")  # a job Slurm does not know
        forged.ensure()
        forged.state_file.write_text(json.dumps(_status(forged, vm=victim_vm, since=0.0, node="node1")))
        own = PilotDir(root, "slurm", "777003")
        own.ensure()
        own.state_file.write_text(json.dumps(_status(own, since=0.0)))  # "saved long ago"
        agent = Agent(cfg, slurm_adapter, rms="slurm", metrics=AgentMetrics())
        first, second = agent.tick(), agent.tick()
        assert first.errors == [] and second.errors == []
        assert first.cleaned == [] and second.cleaned == [], "cleanup_after_s runs on the agent's clock"
        cfg.agent.cleanup_after_s = 0
        third = agent.tick()
        assert third.cleaned == ["777003"], "its own (empty) directory goes; the forged one is never read"
        assert conn.lookupByName(victim_vm).name() == victim_vm, "the other job's VM is still there"
        assert forged.path.exists()
    finally:
        dom.undefine()
        conn.close()
