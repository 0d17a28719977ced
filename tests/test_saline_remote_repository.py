"""A Saline repository on another host (`host:path`, rsync over ssh), issue 21 item 5.

The other host is tests/services/wire_host.py's: a network namespace of its own (every byte
to it crosses a veth: the first test counts them), its own tmpfs at a path the first host sees
empty, reached by ssh with the run's own key. The VMs run on libvirt's
test driver (a save there writes a real state file); no guest is booted. The last test puts
a node on that host instead (issue 38 item 5: a resume there fetches the snapshot over ssh
and checks it where it arrived); the real guest crossing hosts is test_saline_e2e's kill.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.oar.client import OarRest
from plugins.oar.parse import OarJob
from provisioning import transfer
from provisioning.driver import Driver, SnapshotError
from provisioning.transfer import Endpoint
from saline_bew import deployment, identity, journal, node_files, snapshots
from saline_bew.manager import Manager
from saline_bew.repository import Repository, RepositoryError
from saline_bew.sites import Site
from saline_bew.vms import SalineVMs, snapshot_files
from tests.saline_env import make_image
from tests.services import free_port
from tests.services.second_host import SecondHost, second_host_over_wire  # noqa: F401 - fixture
from vjob.config import parse
from vjob.model import VMState
from vjob.store.db import Store

pytestmark = pytest.mark.libvirt


@pytest.mark.parametrize(
    "spec",
    [
        "-oProxyCommand=touch /tmp/x:/srv/repo",  # an ssh option, not a host
        "host:relative/path",
        "relative/local/path",
        "host:/srv/../etc",
        "host;rm -rf /:/srv",
        "host:/srv/repo with space",
        "host:/srv/$(id)",
        "a:b:/srv",
    ],
)
def test_a_bad_host_path_is_refused_naming_it(spec: str) -> None:
    with pytest.raises(RepositoryError, match=r"site a: repository .*HOST:/ABSOLUTE/PATH"):
        Repository("a", spec)


def test_host_path_and_local_paths_are_told_apart() -> None:
    remote = Repository("a", "repo-host.grid:/srv/vjob/repository")
    assert (remote.host, remote.root) == ("repo-host.grid", Path("/srv/vjob/repository"))
    assert remote.where == "repo-host.grid:/srv/vjob/repository"
    local = Repository("a", "/srv/vjob/re:po")  # a colon after the first '/' is part of a local path
    assert local.host is None and local.root == Path("/srv/vjob/re:po")


@pytest.fixture
def host_b(second_host_over_wire: SecondHost) -> SecondHost:  # noqa: F811 - the fixture imported above
    """The other host: its own network namespace, reached over a veth (tests/services/wire_host.py)."""
    return second_host_over_wire


@pytest.fixture
def manager(
    tmp_path: Path,
    test_nodes: dict[str, str],
    host_b: SecondHost,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Manager]:
    # One ssh connection for all the round trips, as docs/saline.md advises operators: the
    # harness's config plus ControlMaster (the master exits by itself 10 s after the last use).
    control = Path(tempfile.mkdtemp(prefix="h21c", dir="/tmp"))
    config = tmp_path / "ssh_config"
    config.write_text(
        f"ControlMaster auto\nControlPath {control}/%C\nControlPersist 10\n" + host_b.ssh_config.read_text()
    )
    monkeypatch.setenv(transfer.SSH_CONFIG_ENV, str(config))
    store = Store(f"sqlite:///{tmp_path / 'vjob.sqlite'}")
    store.upgrade()
    make_image(store, tmp_path)
    dead_api = f"http://127.0.0.1:{free_port()}/oarapi"
    remote = f"{host_b.ssh_host}:{host_b.root / 'repo' / tmp_path.name}"
    cfg = parse(
        {
            "data_dir": str(tmp_path),
            "provisioning": {
                "nodes": test_nodes,
                "snapshot_dir": str(tmp_path / "snap" / "{node}"),
                "vm_dir": str(tmp_path / "vms" / "{node}"),
            },
            "saline": {"sites": [{"name": "a", "oar_api_url": dead_api, "repository": remote}]},
        }
    )
    sites = {"a": Site("a", OarRest(dead_api, timeout_s=2), Repository("a", remote))}
    with Driver(cfg.provisioning, data_dir=tmp_path, store=store) as driver:
        yield Manager(cfg, store, sites, SalineVMs(driver, store))
    store.close()
    shutil.rmtree(control, ignore_errors=True)  # the master's socket; the master exits by itself


def _running(manager: Manager) -> journal.SalineJob:
    job = journal.create(
        manager.ports.store,
        key="be00000000aa",
        user="alice",
        image="empty",
        command=["true"],
        vm_count=1,
        vcpus=1,
        memory_mb=128,
        walltime="1:00:00",
        site="a",
    )
    assert manager.ports.lease(job.key)
    [ident] = identity.assign(
        manager.ports.store,
        site="a",
        job_key=job.key,
        vm_names=job.vm_names,
        mac_prefix="52:54:00",
        network="10.0.0.0/8",
    )
    vm = job.vm_names[0]
    manager.ports.vms.boot_fresh(
        manager.ports.vms.spec(vm, manager.ports.vms.image("empty"), ["true"], ident, 128, 1), "n1", job_id=job.job_id
    )
    return journal.record(manager.ports.store, job.key, "deployed", phase="running", hosts=["n1"], oar_job_id="1")


def test_snapshots_go_to_the_other_host_are_checked_there_and_come_back(
    manager: Manager,
    host_b: SecondHost,
) -> None:
    repo = manager.ports.sites["a"].repository
    job = _running(manager)
    sent_before = host_b.wire_bytes()[0]
    assert snapshots.snapshot(manager.ports, job, reason="periodic")
    sent = host_b.wire_bytes()[0] - sent_before
    job = journal.get(manager.ports.store, job.key)
    snap = next(e for e in journal.events(manager.ports.store, job.key) if e.kind == "snapshot")
    assert sent >= int(snap.detail["bytes"]) > 0, f"{sent} bytes over the veth for {snap.detail['bytes']}"
    where = repo.label_dir(job.key, job.snapshot_label or "")
    for name in snapshot_files(job.vm_names[0], job.snapshot_label or ""):
        assert host_b.exists(where / name), f"{name} is not on the repository's host"
        assert host_b.run("stat", "-c", "%a", str(where / name)).strip() == "600"
    assert not where.exists(), "the files went to the other host, not to this one's same path"
    assert repo.labels(job.key) == [job.snapshot_label]
    assert not any(manager.ports.vms.stage_dir("n1").iterdir()), "the node keeps no copy once it is in the repository"

    # the bytes that arrived are what is checked: a state altered on the repository's host is refused
    state = where / snapshot_files(job.vm_names[0], job.snapshot_label or "")[0]
    good = host_b.read_bytes(state)
    host_b.run(f"printf x | dd of={state} bs=1 seek=100 conv=notrunc status=none")  # one remote shell line
    with pytest.raises(RepositoryError, match="differs from the node's copy"):
        repo.verify(job.key, job.snapshot_label or "", {state.name: (len(good), _sha(good))})
    host_b.run(f"printf '\\{good[100]:03o}' | dd of={state} bs=1 seek=100 conv=notrunc status=none")
    repo.verify(job.key, job.snapshot_label or "", {state.name: (len(good), _sha(good))})

    # the vjob resumes from the remote snapshot (fetched by rsync, checked against its manifest)
    manager.ports.vms.stop(job.vm_names[0], "n1")
    deployment.deploy(manager.ports, journal.get(manager.ports.store, job.key), _running_job(job))
    assert manager.ports.vms.driver.state(job.vm_names[0], "n1") is VMState.RUNNING
    assert journal.events(manager.ports.store, job.key)[-1].kind == "resumed"

    # a newer snapshot replaces it there; the end of the vjob removes it there
    first = job.snapshot_label
    assert snapshots.snapshot(manager.ports, journal.get(manager.ports.store, job.key), reason="periodic")
    assert first not in repo.labels(job.key) and len(repo.labels(job.key)) == 1
    repo.remove_job(job.key)
    assert repo.labels(job.key) == [] and not host_b.exists(repo.root / job.key)


def test_an_unusable_remote_repository_is_not_reported_safe(manager: Manager) -> None:
    job = _running(manager)
    manager.ports.sites["a"].repository = Repository("a", "vjob-no-such-host.invalid:/srv/repo")
    assert not snapshots.snapshot(manager.ports, job, reason="periodic")
    after = journal.get(manager.ports.store, job.key)
    assert after.snapshot_label is None and "vjob-no-such-host.invalid:/srv/repo: not usable" in after.error
    assert manager.ports.vms.driver.state(job.vm_names[0], "n1") is VMState.RUNNING


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _running_job(job: journal.SalineJob, node: str = "n1") -> OarJob:
    """The vjob's OAR job as OAR shows it once it runs again on `node`."""
    return OarJob(id="2", state="Running", user=job.user, types=("besteffort",), hosts=(node,), resources=(3,))


# A stand-in for a bad network around the real rsync: once the real copy is done, the byte at
# offset 100 of the file whose name holds "$RSYNC_HIT" is changed where it arrived (on the
# second host, before transfer.copy renames it into place). Every call is logged.
FLIP = """#!/bin/sh
echo "$*" >> "$RSYNC_CALLS"
{real} "$@" || exit $?
for last; do :; done
case "$last" in
  *"$RSYNC_HIT"*) ssh -F "$VJOB_SSH_CONFIG" "${{last%%:*}}" sh {flip} "${{last#*:}}" ;;
esac
"""
FLIP_SCRIPT = """b=$(dd if="$1" bs=1 skip=100 count=1 status=none | od -An -tu1 | tr -d ' ')
printf "\\\\$(printf %o $(((${b:-0} + 1) % 256)))" | dd of="$1" bs=1 seek=100 conv=notrunc status=none
"""


@pytest.fixture
def cross(
    tmp_path: Path,
    test_nodes: dict[str, str],
    host_b: SecondHost,
) -> Iterator[Manager]:
    """Site a's node n1 on this host, site b's node n2 on the second host (its snapshot dir
    on the tmpfs only that host sees); one repository, on this host."""
    store = Store(f"sqlite:///{tmp_path / 'vjob.sqlite'}")
    store.upgrade()
    make_image(store, tmp_path)
    dead_api = f"http://127.0.0.1:{free_port()}/oarapi"
    base = host_b.root / tmp_path.name
    cfg = parse(
        {
            "data_dir": str(tmp_path),
            "provisioning": {
                "nodes": test_nodes,
                "hosts": {"n1": "", "n2": host_b.ssh_host},
                "copy_method": "rsync",
                "snapshot_dir": str(base / "snap" / "{node}"),
                "vm_dir": str(base / "vms" / "{node}"),
            },
            "saline": {"sites": [{"name": "a", "oar_api_url": dead_api, "repository": str(tmp_path / "repo")}]},
        }
    )
    sites = {"a": Site("a", OarRest(dead_api, timeout_s=2), Repository("a", str(tmp_path / "repo")))}
    with Driver(cfg.provisioning, data_dir=tmp_path, store=store) as driver:
        yield Manager(cfg, store, sites, SalineVMs(driver, store))
    store.close()
    host_b.run("rm", "-rf", "--", str(base))


def test_a_snapshot_altered_on_the_way_to_the_other_host_is_refused_and_kept(
    cross: Manager,
    host_b: SecondHost,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The resume at a node of another host fetches the snapshot from the repository over
    ssh and checks every file where it arrived against the digests the journal took at the
    snapshot: an overlay altered on the way (its state and manifest intact, so the driver's
    own manifest check would pass) is refused before libvirt sees anything, the copies are
    removed from that host, and the repository's snapshot still verifies."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "flip.sh").write_text(FLIP_SCRIPT)
    (bindir / "rsync").write_text(FLIP.format(real=shutil.which("rsync"), flip=tmp_path / "flip.sh"))
    (bindir / "rsync").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("RSYNC_CALLS", str(tmp_path / "rsync.calls"))
    monkeypatch.setenv("RSYNC_HIT", ".overlay.qcow2")
    ports = cross.ports
    job = _running(cross)  # on n1, this host
    assert snapshots.snapshot(ports, job, reason="periodic")
    job = journal.get(ports.store, job.key)
    label, vm = job.snapshot_label or "", job.vm_names[0]
    files = next(e.detail["files"] for e in journal.events(ports.store, job.key) if e.kind == "snapshot")
    assert sorted(files) == sorted(snapshot_files(vm, label))
    ports.vms.stop(vm, "n1")

    with pytest.raises(SnapshotError, match=rf"{vm}@{label}.overlay.qcow2 is corrupt"):
        deployment.deploy(ports, job, _running_job(job, "n2"))
    calls = (tmp_path / "rsync.calls").read_text()
    assert f"{host_b.ssh_host}:" in calls and ".overlay.qcow2" in calls, calls  # it went over the wire
    stage = ports.vms.stage_dir("n2")
    assert host_b.run("ls", "-A", "--", str(stage)).split() == [], "the refused copies stay on the host"
    assert ports.vms.driver.state(vm, "n2") is None  # nothing started there
    assert journal.events(ports.store, job.key)[-1].kind == "snapshot"  # no resume journalled
    ports.sites["a"].repository.verify(job.key, label, {n: (s, d) for n, (s, d) in files.items()})


def test_the_copy_method_follows_where_both_ends_are() -> None:
    here, a, b = Path("/s/x"), "node-a.grid", "node-b.grid"
    assert node_files.method(Endpoint(here), Endpoint(here)) == "local"
    assert node_files.method(Endpoint(here), Endpoint(here, a)) == "rsync"
    assert node_files.method(Endpoint(here, a), Endpoint(here, a)) == "rsync"  # transfer.copy: cp on that host
    assert node_files.method(Endpoint(here, a), Endpoint(here, b)) == "scp"  # rsync has no remote-to-remote


def test_an_unreadable_journal_digest_is_not_trusted() -> None:
    with pytest.raises(SnapshotError, match="malformed"):
        node_files.expected_for({"vm0@s1.state": ["12", "ab"]}, "vm0", "s1")
    with pytest.raises(SnapshotError, match="no memory state"):
        node_files.expected_for({"vm0@s1.overlay.qcow2": [12, "ab"]}, "vm0", "s1")
    assert node_files.expected_for(None, "vm0", "s1") == {}  # journalled before digests were
    other = {"vm1@s1.state": [1, "x"], "vm0@s2.state": [1, "y"], "vm0@s1.state": [3, "z"]}
    assert node_files.expected_for(other, "vm0", "s1") == {"vm0@s1.state": (3, "z")}
