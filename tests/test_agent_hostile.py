"""The root agent against a hostile job user (issue 23, items 2, 3 and 6).

A pilot runs as the job's user, so its directory and state.json are the user's: the agent reads
them as data (no symlink, regular file, size limit, typed fields), writes its request without
following anything planted there, never lets a state file name the VM it deletes or the time it
waits, and two agents never act on one cluster (a lease) nor one RMS's agent on another's switch.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator
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
    st = PilotStatus(
        job_id=pdir.job_id, vm=pdir.vm, node="node1", uri="qemu:///system", state=PilotState.SAVED, since=time.time()
    )
    return {**st.to_json(), **changes}


@pytest.fixture
def pdir(tmp_path: Path) -> PilotDir:
    d = PilotDir(tmp_path / "pilots", "slurm", "4242")
    d.ensure()
    return d


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("since", None),
        ("since", float("inf")),
        ("since", "yesterday"),
        ("memory_mb", -1),
        ("vm", "x; rm -rf /"),
        ("state", "pwned"),
        ("saved_nodes", "node1"),
        ("history", [1] * 5),
        ("node", "a\nb"),
    ],
)
def test_a_state_file_with_a_bad_field_is_an_input_error_naming_it(pdir: PilotDir, field: str, value: object) -> None:
    data = _status(pdir, **{field: value})
    pdir.state_file.write_text(json.dumps(data).replace("Infinity", "1e999"))
    with pytest.raises(InputError, match=field):
        pdir.read_state()


@pytest.mark.timeout(60)  # a reader that opened the FIFO blocking would hang here: this bounds it
def test_a_fifo_as_state_file_does_not_hang_the_agent(pdir: PilotDir) -> None:
    os.mkfifo(pdir.state_file)
    with pytest.raises(InputError, match="not a regular file"):
        pdir.read_state()


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
    b.ports.store.opened = store  # the shared store of both agents
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
    config.write_text(
        f'data_dir = "{tmp_path / "data"}"\n[agent]\ninterval_s = 1\nlease_s = 5\n'
        f'[slurm]\nconf = "{slurm_cluster.conf}"\n'
    )
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
        # 60 s bounds a standby that never takes over; how soon it does (lease 5 s, polls every
        # 5/3 s) is not a test's business on shared cores.
        wait_for(lambda: (leases.holder(store, "agent:slurm") or first) != first, 60, "the standby taking over")
        standby = next(p for p in procs if p is not active)
        assert f":{standby.pid}:" in (leases.holder(store, "agent:slurm") or "")
    finally:
        for p in procs:
            p.kill()
            p.wait()


DOMAIN_XML = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
<os><type arch='x86_64'>hvm</type></os></domain>"""


@pytest.mark.slurm
@pytest.mark.libvirt
def test_a_forged_state_file_never_makes_the_agent_delete_a_vm(
    slurm_cluster, slurm_adapter, libvirt_system, tmp_path: Path
) -> None:
    """The reproduced attack: a finished job's directory names another job's VM, with `since` far
    in the past. The agent ignores the file (its VM name is derived from the job id), waits
    cleanup_after_s by its own clock, and deletes only VMs the store records for that job."""
    import libvirt  # heavy: libvirt-python, this test's real target

    victim_vm = "vjob-slurm-777001"
    conn = libvirt.open(libvirt_system)
    dom = conn.defineXML(DOMAIN_XML.format(name=victim_vm))
    try:
        cfg = parse(
            {
                "data_dir": str(tmp_path / "data"),
                "agent": {"cleanup_after_s": 3600},
                "provisioning": {"default_uri": libvirt_system},
            }
        )
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


# -- issue 39, item 2: one user's state file costs only its own job ---------------------------
def _raw_status(pdir: PilotDir, field: str, raw: str) -> str:
    """A state file whose `field` is the JSON text `raw`, verbatim (numbers json.dumps cannot make)."""
    body = json.dumps({**_status(pdir), field: "@@"})
    return body.replace('"@@"', raw)


def _agent_without_rms(tmp_path: Path, root: Path | None = None) -> Agent:
    """An agent whose steps under test read only its pilot root (and store), never the RMS."""
    cfg = parse({"data_dir": str(tmp_path / "data"), "agent": {"pilot_dir": str(root or tmp_path / "pilots")}})
    return Agent(cfg, object(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]


def _saved_dirs(root: Path, *job_ids: str, uid: int | None = None) -> list[PilotDir]:
    """Pilot directories with a valid saved state, owned by `uid` (None: the caller, root)."""
    dirs = [PilotDir(root, "slurm", j) for j in job_ids]
    for d in dirs:
        d.ensure()
        d.state_file.write_text(json.dumps(_status(d)))
        if uid is not None:
            os.chown(d.path, uid, uid)
    return dirs


@pytest.mark.parametrize(
    ("field", "raw", "match"),
    [
        ("since", "1" + "0" * 400, "since"),
        ("cpu_at", "9" * 4000, "cpu_at"),
        ("memory_mb", "9" * 5000, "not valid JSON"),
        ("save_seconds", "-" + "9" * 400, "save_seconds"),
        ("pid", "1" + "0" * 400, "pid"),
    ],
)
def test_huge_numbers_are_an_input_error_not_a_crash(pdir: PilotDir, field: str, raw: str, match: str) -> None:
    """10**400 overflowed math.isfinite; a 5000-digit integer made json.loads raise a bare ValueError."""
    pdir.state_file.write_text(_raw_status(pdir, field, raw))
    with pytest.raises(InputError, match=match):
        pdir.read_state()


@pytest.mark.parametrize("claim", ["/" + "a" * 300, "relative/" + "b" * 256 + "/x"])
def test_a_memory_path_the_kernel_refuses_is_simply_not_saved(pdir: PilotDir, claim: str) -> None:
    """Path.exists() raised ENAMETOOLONG for a 300-character component, in every tick (act._vm_view)."""
    pdir.state_file.write_text(json.dumps(_status(pdir, memory_path=claim)))
    st = pdir.read_state()
    assert st is not None and st.memory_saved is False


def test_one_bad_state_file_costs_only_its_own_job(tmp_path: Path) -> None:
    """Three hostile files beside a good one: read_pilots and the switch view the tick builds from
    them (agent.act._vm_view, which looks at every pilot's memory_path) carry on for the others."""
    from agent.act import _vm_view
    from agent.observe import Observation, read_pilots
    from vjob.model import ClusterView, Job, JobState, Node

    root = tmp_path / "pilots"
    good, huge, digits, long_path = (PilotDir(root, "slurm", j) for j in ("1", "2", "3", "4"))
    for d in (good, huge, digits, long_path):
        d.ensure()
    good.state_file.write_text(json.dumps(_status(good, state="running")))
    huge.state_file.write_text(_raw_status(huge, "since", "1" + "0" * 400))
    digits.state_file.write_text(_raw_status(digits, "boots", "7" * 5000))
    long_path.state_file.write_text(json.dumps(_status(long_path, memory_path="/" + "m" * 300)))
    agent = _agent_without_rms(tmp_path)
    users = {j: "root" for j in ("1", "2", "3", "4")}
    pilots = read_pilots(agent.ports, all_dirs(root, "slurm"), users)
    assert sorted(pilots) == ["1", "4"]
    jobs = tuple(Job(id=j, user="root", rms="slurm", state=JobState.RUNNING, allocated_nodes=("node1",)) for j in users)
    view = ClusterView(now=time.time(), jobs=jobs, nodes=(Node("node1", 4, 4096),))
    vms, target = _vm_view(Observation(view=view, pilots=pilots, sleeping={}, store_ok=True), set())
    assert [vm.job_id for vm in vms.vms] == ["1"] and set(target) == {"1"}


def test_a_directory_of_a_job_the_rms_does_not_know_is_read_only_when_root_owns_it(tmp_path: Path) -> None:
    """A job the RMS forgot: its directory was read whoever owned it. Now only the job's user as
    the store recorded it, or root, may speak for it (observe.read_pilots)."""
    from agent.observe import read_pilots

    root = tmp_path / "pilots"
    _saved_dirs(root, "900001", uid=65534)
    _saved_dirs(root, "900002")
    agent = _agent_without_rms(tmp_path)
    assert sorted(read_pilots(agent.ports, all_dirs(root, "slurm"), {})) == ["900002"]
    assert sorted(read_pilots(agent.ports, all_dirs(root, "slurm"), {"900001": "nobody"})) == ["900001", "900002"]


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("at", "inf", "at"),
        ("at", 1e308 * 10, "at"),
        ("nodes", "node1", "nodes"),
        ("nodes", ["a b"], "nodes"),
        ("request_id", 5, "request_id"),
        ("reason", ["x"], "reason"),
        ("reason", "r" * 5000, "reason"),
        ("kind", ["suspend"], "kind"),
        ("nodes", [f"n{i}" for i in range(5000)], "nodes"),
    ],
)
def test_a_hostile_request_file_is_an_input_error_naming_the_field(
    pdir: PilotDir, field: str, value: object, match: str
) -> None:
    pdir.request_checkpoint("r1", reason="test", nodes=("node1",))
    data = {**json.loads(pdir.request_file.read_text()), field: value}
    pdir.request_file.write_text(json.dumps(data).replace("Infinity", "1e999"))
    with pytest.raises(InputError, match=match):
        pdir.read_request()


def test_a_request_file_with_a_huge_number_is_an_input_error(pdir: PilotDir) -> None:
    pdir.request_checkpoint("r1")
    pdir.request_file.write_text(pdir.request_file.read_text().replace('"at": ', '"at": ' + "9" * 5000 + ', "x": '))
    with pytest.raises(InputError, match="not valid JSON"):
        pdir.read_request()


# -- issue 39, item 3: a squatted pilot directory costs nobody's job -----------------------------
@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A pilot root as an operator makes it (1777, like /tmp) where other accounts can reach it
    (pytest's tmp_path is root's 0700)."""
    top = Path(tempfile.mkdtemp(prefix="vjob-squat-", dir="/tmp"))
    try:
        top.chmod(0o755)
        root = top / "pilots"
        root.mkdir()
        root.chmod(0o1777)
        yield root
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _as(user: str, code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` as `user` (a real account: the kernel decides what it may do)."""
    path = f"{REPO}:{sysconfig.get_paths()['purelib']}"  # the venv's interpreter may be under /root
    return subprocess.run(
        ["/usr/bin/python3", "-c", code],
        user=user,
        group=pwd.getpwnam(user).pw_gid,
        extra_groups=[],
        cwd="/",
        env={"PATH": os.environ["PATH"], "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )


_PILOT_START = """
import time
from vjob.pilot_files import PilotDir, PilotState, PilotStatus
d = PilotDir({root!r}, "slurm", {job!r})
d.ensure()
d.write_state(PilotStatus(job_id={job!r}, vm=d.vm, node="node1", uri="qemu:///session",
                          state=PilotState.RUNNING, since=time.time()))
print(d.path)
"""


def test_a_squatted_pilot_directory_does_not_stop_the_next_job(shared_root: Path, tmp_path: Path) -> None:
    """`nobody` makes the directory of the next job id first; the job's pilot, as `daemon`,
    still starts (it used to die on a PermissionError), again after a requeue in the same
    directory, and the agent hears that pilot, not the squatter."""
    from agent.observe import read_pilots

    squat = _as("nobody", f"import os; os.mkdir({str(shared_root / 'slurm-5001')!r}, 0o777)")
    assert squat.returncode == 0, squat.stderr
    first = _as("daemon", _PILOT_START.format(root=str(shared_root), job="5001"))
    assert first.returncode == 0, first.stderr
    own = Path(first.stdout.strip())
    assert own != shared_root / "slurm-5001" and own.parent == shared_root
    assert os.lstat(own).st_uid == pwd.getpwnam("daemon").pw_uid and stat.S_IMODE(os.lstat(own).st_mode) == 0o700
    again = _as("daemon", _PILOT_START.format(root=str(shared_root), job="5001"))
    assert again.returncode == 0 and Path(again.stdout.strip()) == own, "a requeued pilot finds its directory"
    # The squatter's copy of a state file for that job: written, never heard.
    forged = PilotDir(shared_root, "slurm", "5001")
    forged.state_file.write_text(json.dumps(_status(forged, node="evil")))
    os.chown(forged.state_file, 65534, 65534)
    agent = _agent_without_rms(tmp_path, shared_root)
    pilots = read_pilots(agent.ports, all_dirs(shared_root, "slurm"), {"5001": "daemon"})
    assert pilots["5001"].node == "node1" and pilots["5001"].state is PilotState.RUNNING
    assert agent.ports.pilot_dir("5001").path == own, "the agent's requests go to the job's own directory"


def test_a_root_pilot_never_uses_a_squatted_directory(shared_root: Path) -> None:
    """Root could write into the squatter's directory: it must make its own instead."""
    (shared_root / "slurm-5002").mkdir()
    os.chown(shared_root / "slurm-5002", 65534, 65534)
    d = PilotDir(shared_root, "slurm", "5002")
    d.ensure()
    assert os.lstat(d.path).st_uid == 0 and d.path != shared_root / "slurm-5002"


def test_an_unusable_pilot_root_is_a_one_line_job_error(tmp_path: Path) -> None:
    """The pilot cannot make its directory (here the pilot root is a file): `vjob run` fails the
    job with one line naming the directory, not a traceback."""
    (tmp_path / "not-a-dir").write_text("")
    (tmp_path / "vjob.toml").write_text(
        f'data_dir = "{tmp_path / "data"}"\n[agent]\npilot_dir = '
        f'"{tmp_path / "not-a-dir"}"\n[provisioning]\n'
        'default_uri = "test:///default"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "vjob.cli",
            "--config",
            str(tmp_path / "vjob.toml"),
            "run",
            "--job-id",
            "5003",
            "--node",
            "node1",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    failed = [ln for ln in (run.stdout + run.stderr).splitlines() if ln.startswith("vjob: failed:")]
    assert len(failed) == 1 and "not-a-dir" in failed[0] and "5003" in failed[0], run.stdout + run.stderr


def test_a_forgotten_jobs_directory_is_heard_from_the_user_the_store_recorded(store: Store, tmp_path: Path) -> None:
    """observe.pilot_users: the RMS forgot job 900003, the store still knows it was nobody's."""
    from agent.observe import pilot_users, read_pilots
    from vjob.model import Job
    from vjob.store import jobs as store_jobs

    root = tmp_path / "pilots"
    _saved_dirs(root, "900003", "900004", uid=65534)
    store_jobs.track(store, Job(id="900003", user="nobody", rms="slurm"))
    store_jobs.track(store, Job(id="900004", user="daemon", rms="slurm"))
    agent = _agent_without_rms(tmp_path)
    agent.ports.store.opened = store
    dirs = all_dirs(root, "slurm")
    users = pilot_users(agent.ports, dirs, {})
    assert users == {"900003": "nobody", "900004": "daemon"}
    assert sorted(read_pilots(agent.ports, dirs, users)) == ["900003"]


def test_before_any_observation_the_agent_hears_only_the_jobs_own_directory(store: Store, tmp_path: Path) -> None:
    """Recovery (agent.recover) asks for a job's directory before the first tick has read any:
    the squatter's plain-named one is not it, whether or not the job's own exists."""
    from vjob.model import Job
    from vjob.store import jobs as store_jobs

    root = tmp_path / "pilots"
    (squat,) = _saved_dirs(root, "900005", uid=65534)
    store_jobs.track(store, Job(id="900005", user="daemon", rms="slurm"))
    agent = _agent_without_rms(tmp_path)
    agent.ports.store.opened = store
    with pytest.raises(InputError, match="not by the job's user"):
        agent.ports.pilot_dir("900005").read_state()
    with pytest.raises(InputError, match="not by the job's user"):
        agent.ports.pilot_dir("900005").request_checkpoint("r1")
    assert not squat.request_file.exists()
    own = PilotDir(root, "slurm", "900005", name="slurm-900005~0123456789abcdef")
    own.path.mkdir(mode=0o700)
    own.state_file.write_text(json.dumps(_status(own, node="node7")))
    os.chown(own.path, 1, 1)  # daemon's
    assert agent.ports.pilot_dir("900005").path == own.path
    assert agent.ports.pilot_dir("900005").read_state().node == "node7"
