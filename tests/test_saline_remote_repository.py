"""A Saline repository on another host (`host:path`, rsync over ssh), issue 21 item 5.

The other host is the second host of tests/services/second_host.py: its own tmpfs at a path
the first host sees empty, reached by ssh with the run's own key. The VMs run on libvirt's
test driver (a save there writes a real state file); no guest is booted.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.oar.client import OarRest
from plugins.oar.parse import OarJob
from provisioning import transfer
from provisioning.driver import Driver
from saline_bew import deployment, identity, journal, snapshots
from saline_bew.manager import Manager
from saline_bew.repository import Repository, RepositoryError
from saline_bew.sites import Site
from saline_bew.vms import SalineVMs, snapshot_files
from tests.saline_env import make_image
from tests.services import free_port
from tests.services.second_host import SecondHost, second_host  # noqa: F401 - fixture
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
def manager(
    tmp_path: Path,
    test_nodes: dict[str, str],
    second_host: SecondHost,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Manager]:
    # One ssh connection for all the round trips, as docs/saline.md advises operators: the
    # harness's config plus ControlMaster (the master exits by itself 10 s after the last use).
    control = Path(tempfile.mkdtemp(prefix="h21c", dir="/tmp"))
    config = tmp_path / "ssh_config"
    config.write_text(
        f"ControlMaster auto\nControlPath {control}/%C\nControlPersist 10\n" + second_host.ssh_config.read_text()
    )
    monkeypatch.setenv(transfer.SSH_CONFIG_ENV, str(config))
    store = Store(f"sqlite:///{tmp_path / 'vjob.sqlite'}")
    store.upgrade()
    make_image(store, tmp_path)
    dead_api = f"http://127.0.0.1:{free_port()}/oarapi"
    remote = f"{second_host.ssh_host}:{second_host.root / 'repo' / tmp_path.name}"
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
    second_host: SecondHost,  # noqa: F811
) -> None:
    repo = manager.ports.sites["a"].repository
    job = _running(manager)
    assert snapshots.snapshot(manager.ports, job, reason="periodic")
    job = journal.get(manager.ports.store, job.key)
    where = repo.label_dir(job.key, job.snapshot_label or "")
    for name in snapshot_files(job.vm_names[0], job.snapshot_label or ""):
        assert second_host.exists(where / name), f"{name} is not on the repository's host"
        assert second_host.run("stat", "-c", "%a", str(where / name)).strip() == "600"
    assert not where.exists(), "the files went to the other host, not to this one's same path"
    assert repo.labels(job.key) == [job.snapshot_label]
    assert not any(manager.ports.vms.stage_dir("n1").iterdir()), "the node keeps no copy once it is in the repository"

    # the bytes that arrived are what is checked: a state altered on the repository's host is refused
    state = where / snapshot_files(job.vm_names[0], job.snapshot_label or "")[0]
    good = second_host.read_bytes(state)
    second_host.run(f"printf x | dd of={state} bs=1 seek=100 conv=notrunc status=none")  # one remote shell line
    with pytest.raises(RepositoryError, match="differs from the node's copy"):
        repo.verify(job.key, job.snapshot_label or "", {state.name: (len(good), _sha(good))})
    second_host.run(f"printf '\\{good[100]:03o}' | dd of={state} bs=1 seek=100 conv=notrunc status=none")
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
    assert repo.labels(job.key) == [] and not second_host.exists(repo.root / job.key)


def test_an_unusable_remote_repository_is_not_reported_safe(manager: Manager) -> None:
    job = _running(manager)
    manager.ports.sites["a"].repository = Repository("a", "vjob-no-such-host.invalid:/srv/repo")
    assert not snapshots.snapshot(manager.ports, job, reason="periodic")
    after = journal.get(manager.ports.store, job.key)
    assert after.snapshot_label is None and "vjob-no-such-host.invalid:/srv/repo: not usable" in after.error
    assert manager.ports.vms.driver.state(job.vm_names[0], "n1") is VMState.RUNNING


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _running_job(job: journal.SalineJob) -> OarJob:
    """The vjob's OAR job as OAR shows it once it runs again on n1."""
    return OarJob(id="2", state="Running", user=job.user, types=("besteffort",), hosts=("n1",), resources=(3,))
