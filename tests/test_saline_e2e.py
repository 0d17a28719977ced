"""Saline end to end: a real OAR kills a best-effort vjob running a real QEMU counter guest.

Site a is OAR's resources on host localhost with the system libvirtd, site b those on host
127.0.0.1, whose node is the second host (tests/services/oar.py explains the one-OAR
layout). That host is another machine as far as the network goes (tests/services/wire_host.py):
a network namespace of its own behind a veth, with its own libvirtd (reached by qemu+ssh://),
sshd and QEMUs; its VM and snapshot directories, and site b's repository, are on a tmpfs only
it sees. The snapshot, the libvirt connection and a migration's memory cross the veth (the
kernel's byte count is checked); the hosts share only the rest of the filesystem (the OS image,
the guest's kernel). A normal job that needs all of site a makes OAR kill the vjob; site a is
then full, so the manager must resume it at site b from the latest snapshot in site a's
repository, which goes over ssh to site b's node and is checked there. The guest prints
COUNTER n once a second: the first value after the resume tells how much work was lost.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devkit import guest_probe, saline_bench
from devkit.guest_probe import wait_for_counter
from plugins.oar.client import OarCommands, SubmitRequest
from plugins.oar.parse import FINAL_STATES
from provisioning import guest, network
from provisioning.driver import Driver
from provisioning.images import Catalogue
from saline_bew import identity, journal
from saline_bew.manager import Manager
from saline_bew.repository import Repository
from saline_bew.sites import Site
from saline_bew.vms import SalineVMs
from tests.saline_env import InteractiveJob, until
from tests.services.second_host import SecondHost, second_host_over_wire  # noqa: F401 - fixture
from vjob.config import ProvisioningConfig, parse
from vjob.store.db import Store

pytestmark = [pytest.mark.oar, pytest.mark.realvm, pytest.mark.libvirt]

COUNTER = ["sh", "-c", "i=0; while true; do i=$((i+1)); echo COUNTER $i; sleep 1; done"]
PERIOD_S = 6


HOST_B = "127.0.0.1"
"""Site b's OAR host: its node is the second host."""


class Env:
    def __init__(self, work: Path, oar_cluster, nodes: dict[str, str], host_b: SecondHost) -> None:
        self.work = work
        self.oar = oar_cluster
        self.nodes = nodes
        self.host_b = host_b
        self.far = host_b.root / work.name
        """Under the path only the second host sees as its own: site b's files there."""
        self.store = Store(f"sqlite:///{work / 'vjob.sqlite'}")
        self.store.upgrade()
        image = work / "images" / "empty.qcow2"
        image.parent.mkdir()
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True, timeout=30)
        Catalogue(self.store, ProvisioningConfig(), data_dir=work).add("empty", image)

    def manager(self, **saline: object) -> Manager:
        """A manager of both sites: each host its own VM and snapshot directories at the same
        paths (nothing shared: a migration copies the disks), site a's repository on this host,
        site b's on the second."""
        repositories = {"a": str(self.work / "repo-a"), "b": f"{self.host_b.ssh_host}:{self.far / 'repo-b'}"}
        cfg = parse(
            {
                "data_dir": str(self.work),
                "provisioning": {
                    "nodes": self.nodes,
                    "hosts": {"localhost": "", HOST_B: self.host_b.ssh_host},
                    "copy_method": "rsync",
                    # one path on both hosts, two filesystems (as real nodes have: the driver
                    # keeps a VM's paths when it moves, so nothing in its XML names the other host)
                    "snapshot_dir": str(self.far / "snap"),
                    "vm_dir": str(self.far / "vms"),
                    "migrate_uris": self.host_b.migrate_uris("localhost", HOST_B),  # over the veth
                    "operation_timeout_s": 120,
                },
                "saline": {
                    "poll_interval_s": 1,
                    "requeue_after_s": 20,
                    **saline,
                    "sites": [
                        {"name": s, "repository": repositories[s], "oar_properties": self.oar.properties(s)}
                        for s in ("a", "b")
                    ],
                },
            }
        )
        client = OarCommands(timeout_s=30)
        sites = {
            sc.name: Site(sc.name, client, Repository(sc.name, sc.repository), sc.oar_properties)
            for sc in cfg.saline.sites
        }
        driver = Driver(cfg.provisioning, data_dir=self.work, store=self.store)
        # One site master restarting: the same lease owner, so it takes its vjobs back at once.
        return Manager(cfg, self.store, sites, SalineVMs(driver, self.store), owner="e2e-master")


@pytest.fixture(scope="module")
def env(
    oar_cluster,
    libvirt_system: str,
    second_host_over_wire: SecondHost,  # noqa: F811 - the fixture imported above
    tiny_guest: guest.GuestFiles,
) -> Iterator[Env]:
    work = Path(tempfile.mkdtemp(prefix="vjob-saline-", dir="/var/tmp"))
    work.chmod(0o755)  # QEMU (libvirt-qemu) must reach overlays and images
    host_b = second_host_over_wire
    made = Env(work, oar_cluster, {"localhost": libvirt_system, HOST_B: host_b.uri}, host_b)
    try:
        yield made
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(made.far, ignore_errors=True)  # site a's files, at the same path on this host
        host_b.run("rm", "-rf", "--", str(made.far))


def _console(env: Env, manager: Manager, job: journal.SalineJob, node: str) -> Path:
    """The guest's console log on `node` as a file of this host (fetched from the second host
    when it is there alone)."""
    path = manager.ports.vms.console_log(job.vm_names[0], node)
    if node == "localhost":
        return path
    local = env.work / f"console-{job.key}.log"
    local.write_bytes(env.host_b.read_bytes(path))
    return local


def _counters(env: Env, manager: Manager, job: journal.SalineJob, node: str) -> list[int]:
    return guest_probe.counters(_console(env, manager, job, node))


def _saline_settings(manager: Manager) -> dict[str, object]:
    cfg = manager.ports.cfg
    return {
        "snapshot_period_s": cfg.snapshot_period_s,
        "checkpoint_delay_s": cfg.checkpoint_delay_s,
        "migrate_wait_s": cfg.migrate_wait_s,
    }


def _fill_site_a(env: Env) -> str:
    """A normal job needing every resource of site a: OAR must kill the best-effort vjob."""
    req = SubmitRequest(
        command=["sleep", "600"],
        resource=f"/resource_id={env.oar.resources_per_site}",
        walltime="0:15:00",
        properties=env.oar.properties("a"),
    )
    return OarCommands().submit(req, user=env.oar.user)


def _batch_blocker(env: Env) -> Callable[[], None]:
    blocker = _fill_site_a(env)

    def end() -> None:
        """Deleted, and gone: OAR ends a deleted job a while later, and a vjob submitted at
        site a meanwhile (the next test's) would find it full and be moved to site b."""
        client = OarCommands()
        client.delete(blocker, user=env.oar.user)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            seen = client.job(blocker)
            if seen is None or seen.state in FINAL_STATES:
                return
            time.sleep(1)
        raise AssertionError(f"OAR did not end the blocker job {blocker} within 120 s of its deletion")

    return end


def _run_kill_resume(
    env: Env,
    manager: Manager,
    fill: Callable[[Env], Callable[[], None]] = _batch_blocker,
    measure: Callable[[Manager, journal.SalineJob], None] | None = None,
) -> tuple[list[int], list[int], journal.SalineJob]:
    """Start at site a, get killed there by a normal job (`fill` submits it and returns how
    to end it), resume at site b (`measure` is called as soon as the vjob runs there).

    The kill is handled by a *new* Manager over the same store, as after a restart of the
    manager process: everything it needs must come from the journal.
    """
    job = manager.submit(user=env.oar.user, image="empty", command=COUNTER, site="a")
    blockers: list[Callable[[], None]] = []  # how to end the normal job, once submitted
    try:  # whatever fails, the vjob and the blocker are ended (no guest left running at a)
        job = until(manager, job.key, lambda j: j.phase == "running", 120, "deployed at site a")
        assert job.hosts == ("localhost",)
        log_a = manager.ports.vms.console_log(job.vm_names[0], "localhost")
        wait_for_counter(log_a, 3, 120)  # booted and counting (TCG boots take several seconds)
        counting_at = time.time()
        if manager.ports.cfg.snapshot_period_s < 600:  # wait for a snapshot of a counting guest, then 2 more ticks
            until(manager, job.key, lambda j: (j.snapshot_at or 0) > counting_at, 60, "a snapshot while counting")
            wait_for_counter(log_a, (guest_probe.last_counter(log_a) or 0) + 2, 30)
        blockers.append(fill(env))
        manager.ports.vms.driver.close()
        manager = env.manager(**_saline_settings(manager))  # the manager restarts: state comes from the store
        resumed = until(manager, job.key, lambda j: j.phase == "running" and j.site == "b", 180, "resumed at b")
        assert resumed.hosts == (HOST_B,)
        if measure is not None:  # before the next pass: a snapshot at b would replace site a's
            measure(manager, resumed)
        before = _counters(env, manager, job, "localhost")

        def ran_on() -> bool:  # two ticks at b, in b's own console log
            return len(_counters(env, manager, job, HOST_B)) >= 2

        deadline = time.monotonic() + 60
        while not ran_on() and time.monotonic() < deadline:
            time.sleep(0.5)
        after = _counters(env, manager, job, HOST_B)
        _assert_on_its_network(manager, resumed, HOST_B)
        return before, after, resumed
    finally:
        try:
            for end_blocker in blockers:
                end_blocker()
        finally:  # the vjob's OAR job goes too, whatever ending the blocker raised
            manager.cancel(job.key)
            manager.step()


def _assert_on_its_network(manager: Manager, job: journal.SalineJob, node: str) -> None:
    """After the relocation (restored from a snapshot, or live-migrated) the VM at `node` has
    its NIC on the vjob's bridge with the MAC of its subnetID/vmID, as at site a."""
    (ident,) = identity.assign(
        manager.ports.store,
        site=job.site,
        job_key=job.key,
        vm_names=job.vm_names,
        mac_prefix=manager.ports.cfg.mac_prefix,
        network=manager.ports.cfg.network,
    )
    dom = manager.ports.vms.driver.connection(node).lookupByName(job.vm_names[0])
    nics = [
        (nic.find("mac").get("address"), nic.find("source").get("bridge"))  # type: ignore[union-attr]
        for nic in ET.fromstring(dom.XMLDesc(0)).findall("./devices/interface[@type='bridge']")
    ]
    assert nics == [(ident.mac, network.bridge_name(ident.subnet_id, network.SALINE_FAMILY))], nics


def test_killed_vjob_resumes_at_the_other_site_from_its_last_snapshot(env: Env) -> None:
    """Killed at site a (this host), resumed at site b (the second host) from site a's
    repository: the snapshot's files go over ssh to b's node, each checked there against the
    journal's digests (a copy altered on the way: test_saline_remote_repository), and the
    guest runs on with its memory; its next snapshot is made on b into b's repository. The
    figures of the move are printed as one JSON line, beside a plain rsync of the same files
    over the same ssh link."""
    figures: dict[str, object] = {}

    def measure(manager: Manager, job: journal.SalineJob) -> None:
        events = journal.events(manager.ports.store, job.key)
        resumed = next(e for e in reversed(events) if e.kind == "resumed")
        label = str(resumed.detail["label"])
        snap = next(e for e in events if e.kind == "snapshot" and e.detail.get("label") == label)
        files = sorted((env.work / "repo-a" / job.key / label).iterdir())  # site a's: on this host
        assert resumed.detail["from"] == str(env.work / "repo-a") and resumed.detail["hosts"] == [HOST_B]
        assert resumed.detail["bytes"] == sum(f.stat().st_size for f in files) == snap.detail["bytes"]
        overlay = manager.ports.vms.driver.overlay_path(job.vm_names[0], HOST_B)  # a's path too
        assert env.host_b.exists(overlay) and not overlay.exists(), "b's disk is on b only"
        sent = env.host_b.wire_bytes()[0] - sent_before  # the kernel's count on this end of the veth
        assert sent >= resumed.detail["bytes"], f"{sent} bytes over the veth for a {resumed.detail['bytes']}-byte move"
        plain_s = saline_bench.plain_rsync(files, env.host_b.ssh_host, env.far / "plain", env.host_b.ssh_config)
        figures.update(saline_bench.move_figures(snap.detail, resumed.detail, plain_s), wire_bytes_to_b=sent)
        # the next periodic snapshot is made on b (staged, hashed there) into b's repository,
        # also on b (copied there), and replaces site a's
        at_b = until(manager, job.key, lambda j: j.snapshot_site == "b", 60, "a snapshot at b")
        state = f"{job.vm_names[0]}@{at_b.snapshot_label}.state"
        assert env.host_b.exists(env.far / "repo-b" / job.key / str(at_b.snapshot_label) / state)
        assert manager.ports.sites["a"].repository.labels(job.key) == []

    manager = env.manager(snapshot_period_s=PERIOD_S, checkpoint_delay_s=0)
    sent_before = env.host_b.wire_bytes()[0]  # nothing of the vjob is on b yet
    before, after, job = _run_kill_resume(env, manager, measure=measure)
    events = journal.events(manager.ports.store, job.key)
    kinds = [e.kind for e in events]
    assert "snapshot" in kinds and "killed" in kinds and "resumed" in kinds
    killed = next(e for e in events if e.kind == "killed")
    assert killed.detail["cause"] == "besteffort_kill"
    assert job.kills == 1 and job.restarts_from_scratch == 0
    assert before and after, (before, after)
    assert after[0] > 1, "the guest restarted from scratch instead of resuming"
    lost = before[-1] - (after[0] - 1)
    assert 0 <= lost <= PERIOD_S + 3, f"lost {lost} counter ticks (period {PERIOD_S} s): {before[-5:]} → {after[:3]}"
    assert guest_probe.boots(_console(env, manager, job, HOST_B)) == 0  # restored, never booted there
    assert figures, "the move was not measured"
    print(f"\nwork lost at kill (periodic snapshots every {PERIOD_S} s): {lost} s; journal {kinds}")
    print(json.dumps({"bench": "saline_cross_host", "lost_s": lost, **figures}))


def test_with_the_checkpoint_signal_nothing_is_lost(env: Env) -> None:
    manager = env.manager(snapshot_period_s=3600, checkpoint_delay_s=60, migrate_wait_s=0)
    before, after, job = _run_kill_resume(env, manager)
    events = journal.events(manager.ports.store, job.key)
    killed = next(e for e in events if e.kind == "killed")
    assert killed.detail["cause"] == "checkpoint" and killed.detail["lost_s"] == 0
    snap = next(e for e in events if e.kind == "snapshot")
    assert snap.detail["reason"] == "checkpoint"
    assert after[0] == before[-1] + 1, f"work lost across the checkpoint: {before[-3:]} → {after[:3]}"
    # live migration off (migrate_wait_s = 0): the manager suspends at once
    relocated = next(e for e in events if e.kind == "relocation")
    assert relocated.detail["path"] == "suspend" and "migrate_wait_s = 0" in relocated.detail["reason"]
    resumed = next(e for e in events if e.kind == "resumed")
    print(
        f"\ncheckpoint signal: counter {before[-1]} → {after[0]} (nothing lost); nodes freed "
        f"{relocated.detail['freed_s']:.1f} s after OAR's warning, running at b after "
        f"{resumed.detail['since_warning_s']:.1f} s"
    )


def test_oarsub_interactive_takes_the_nodes_of_a_besteffort_vjob(env: Env) -> None:
    """A user's `oarsub -I` on a full site: OAR warns the vjob, and Saline, finding site b free,
    asks OAR for it there and migrates the VM to the other host, which shares no VM directory
    with this one: its overlay is copied and checked there while the guest is paused (TCG),
    then its memory (provisioning.migration). The user gets the shell long before OAR's 60 s
    kill deadline, the guest is never saved or rebooted, nothing is written to the repository,
    and the counter goes on at b where it stopped at a. (The suspension path on a warning is
    the test above.)"""
    shells: list[InteractiveJob] = []

    def interactive(env: Env) -> Callable[[], None]:
        shell = InteractiveJob(
            env.oar.user, f"/resource_id={env.oar.resources_per_site},walltime=0:10:00", env.oar.properties("a")
        )
        shells.append(shell)
        return shell.close

    disks: list[bool] = []

    def where_the_disk_is(manager: Manager, job: journal.SalineJob) -> None:  # on b only, once there
        overlay = manager.ports.vms.driver.overlay_path(job.vm_names[0], HOST_B)  # a's path too
        disks.extend([env.host_b.exists(overlay), overlay.exists()])

    manager = env.manager(snapshot_period_s=3600, checkpoint_delay_s=60)
    before, after, job = _run_kill_resume(env, manager, fill=interactive, measure=where_the_disk_is)
    shell = shells[0]
    assert shell.started_after_s is not None, shell.output[-600:]
    assert shell.started_after_s < 60, f"the shell waited {shell.started_after_s:.0f} s: OAR's kill, not Saline"
    seen = OarCommands().job(shell.job_id or "")
    assert seen is not None and seen.job_type == "INTERACTIVE", seen
    events = journal.events(manager.ports.store, job.key)
    kinds = [e.kind for e in events]
    migrated = next((e for e in events if e.kind == "migrated"), None)
    assert migrated is not None, json.dumps([(e.kind, e.detail) for e in events])
    assert migrated.detail["path"] == "migrate_other_site" and migrated.detail["hosts"] == [HOST_B]
    assert "killed" not in kinds and "snapshot" not in kinds and job.kills == 0
    assert (
        manager.ports.sites["a"].repository.labels(job.key) == []
        and manager.ports.sites["b"].repository.labels(job.key) == []
    )
    # a console log per host: 1..n at a, then n+1.. at b, without a gap or a reboot
    assert before == list(range(1, len(before) + 1)), f"the counter jumped at a: {before}"
    assert after == list(range(before[-1] + 1, before[-1] + 1 + len(after))), f"{before[-3:]} → {after[:5]}"
    assert len(after) >= 2 and guest_probe.boots(_console(env, manager, job, HOST_B)) == 0
    assert disks == [True, False], f"the overlay on b, on a: {disks} (copied to b, a's copy removed)"
    print(
        f"\noarsub -I: shell after {shell.started_after_s:.1f} s; migrated to b (disks copied) "
        f"{migrated.detail['since_warning_s']:.1f} s after OAR's warning (migration "
        f"{migrated.detail['migrate_s']:.1f} s); counter 1..{before[-1]} at a, {after[0]}..{after[-1]} at b"
    )
