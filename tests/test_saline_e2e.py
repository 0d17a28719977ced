"""Saline end to end: a real OAR kills a best-effort vjob running a real QEMU counter guest.

Site a is OAR's resources on host localhost with the system libvirtd, site b those on host
127.0.0.1 with the second libvirtd (tests/services/oar.py explains the one-OAR layout). A
normal job that needs all of site a makes OAR kill the vjob; site a is then full, so the
manager must resume it at site b from the latest snapshot in site a's repository. The guest
prints COUNTER n once a second: the first value after the resume tells how much work was lost.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devkit import guest_probe
from devkit.guest_probe import wait_for_counter
from plugins.oar.client import OarCommands, SubmitRequest
from provisioning import guest, network
from provisioning.driver import Driver
from provisioning.images import Catalogue
from saline_bew import identity, journal
from saline_bew.manager import Manager
from saline_bew.repository import Repository
from saline_bew.sites import Site
from saline_bew.vms import SalineVMs
from tests.saline_env import InteractiveJob, until
from vjob.config import ProvisioningConfig, parse
from vjob.store.db import Store

pytestmark = [pytest.mark.oar, pytest.mark.realvm, pytest.mark.libvirt]

COUNTER = ["sh", "-c", "i=0; while true; do i=$((i+1)); echo COUNTER $i; sleep 1; done"]
PERIOD_S = 6


class Env:
    def __init__(self, work: Path, oar_cluster, nodes: dict[str, str]) -> None:
        self.work = work
        self.oar = oar_cluster
        self.nodes = nodes
        self.store = Store(f"sqlite:///{work / 'vjob.sqlite'}")
        self.store.upgrade()
        image = work / "images" / "empty.qcow2"
        image.parent.mkdir()
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True, timeout=30)
        Catalogue(self.store, ProvisioningConfig(), data_dir=work).add("empty", image)

    def manager(self, *, shared_vms: bool = False, **saline: object) -> Manager:
        """`shared_vms`: one vm_dir for both hosts (as shared storage would give), so the
        manager can live-migrate on OAR's warning; else one per host, so it suspends."""
        cfg = parse(
            {
                "data_dir": str(self.work),
                "provisioning": {
                    "nodes": self.nodes,
                    "snapshot_dir": str(self.work / "snap" / "{node}"),
                    "vm_dir": str(self.work / ("vms" if shared_vms else "vms/{node}")),
                    "migrate_uris": {node: "tcp://127.0.0.1" for node in self.nodes},
                    "operation_timeout_s": 120,
                },
                "saline": {
                    "poll_interval_s": 1,
                    "requeue_after_s": 20,
                    **saline,
                    "sites": [
                        {
                            "name": s,
                            "repository": str(self.work / f"repo-{s}"),
                            "oar_properties": self.oar.properties(s),
                        }
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
def env(oar_cluster, libvirt_system: str, libvirt_second_node: str, tiny_guest: guest.GuestFiles) -> Iterator[Env]:
    work = Path(tempfile.mkdtemp(prefix="vjob-saline-", dir="/var/tmp"))
    work.chmod(0o755)  # QEMU (libvirt-qemu) must reach overlays and images
    try:
        yield Env(work, oar_cluster, {"localhost": libvirt_system, "127.0.0.1": libvirt_second_node})
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _counters(manager: Manager, job: journal.SalineJob, node: str) -> list[int]:
    return guest_probe.counters(manager.ports.vms.console_log(job.vm_names[0], node))


def _saline_settings(manager: Manager) -> dict[str, object]:
    return {
        "snapshot_period_s": manager.ports.cfg.snapshot_period_s,
        "checkpoint_delay_s": manager.ports.cfg.checkpoint_delay_s,
        "shared_vms": manager.ports.vms.can_migrate(),
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
    return lambda: OarCommands().delete(blocker, user=env.oar.user)


def _run_kill_resume(
    env: Env, manager: Manager, fill: Callable[[Env], Callable[[], None]] = _batch_blocker
) -> tuple[list[int], list[int], journal.SalineJob]:
    """Start at site a, get killed there by a normal job (`fill` submits it and returns how
    to end it), resume at site b.

    The kill is handled by a *new* Manager over the same store, as after a restart of the
    manager process: everything it needs must come from the journal.
    """
    job = manager.submit(user=env.oar.user, image="empty", command=COUNTER, site="a")
    job = until(manager, job.key, lambda j: j.phase == "running", 120, "deployed at site a")
    assert job.hosts == ("localhost",)
    log_a = manager.ports.vms.console_log(job.vm_names[0], "localhost")
    wait_for_counter(log_a, 3, 120)  # booted and counting (TCG boots take several seconds)
    counting_at = time.time()
    if manager.ports.cfg.snapshot_period_s < 600:  # wait for a snapshot of a counting guest, then 2 more ticks
        until(manager, job.key, lambda j: (j.snapshot_at or 0) > counting_at, 60, "a snapshot while counting")
        wait_for_counter(log_a, (guest_probe.last_counter(log_a) or 0) + 2, 30)
    end_blocker = fill(env)
    manager.ports.vms.driver.close()
    manager = env.manager(**_saline_settings(manager))  # the manager restarts: state comes from the store
    try:
        resumed = until(manager, job.key, lambda j: j.phase == "running" and j.site == "b", 180, "resumed at b")
        assert resumed.hosts == ("127.0.0.1",)
        before = _counters(manager, job, "localhost")
        log_b = manager.ports.vms.console_log(job.vm_names[0], "127.0.0.1")
        shared = log_b == manager.ports.vms.console_log(job.vm_names[0], "localhost")  # one vm_dir: one log

        def ran_on() -> bool:  # two ticks at b (with one log: two beyond what it had at the move)
            seen = guest_probe.counters(log_b)
            return bool(seen) and seen[-1] >= before[-1] + 2 if shared else len(seen) >= 2

        deadline = time.monotonic() + 60
        while not ran_on() and time.monotonic() < deadline:
            time.sleep(0.5)
        after = guest_probe.counters(log_b)
        _assert_on_its_network(manager, resumed, "127.0.0.1")
        return before, after, resumed
    finally:
        try:
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
    manager = env.manager(snapshot_period_s=PERIOD_S, checkpoint_delay_s=0)
    before, after, job = _run_kill_resume(env, manager)
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
    assert (
        guest_probe.boots(manager.ports.vms.console_log(job.vm_names[0], "127.0.0.1")) == 0
    )  # restored, never booted there
    print(f"\nwork lost at kill (periodic snapshots every {PERIOD_S} s): {lost} s; journal {kinds}")


def test_with_the_checkpoint_signal_nothing_is_lost(env: Env) -> None:
    manager = env.manager(snapshot_period_s=3600, checkpoint_delay_s=60)
    before, after, job = _run_kill_resume(env, manager)
    events = journal.events(manager.ports.store, job.key)
    killed = next(e for e in events if e.kind == "killed")
    assert killed.detail["cause"] == "checkpoint" and killed.detail["lost_s"] == 0
    snap = next(e for e in events if e.kind == "snapshot")
    assert snap.detail["reason"] == "checkpoint"
    assert after[0] == before[-1] + 1, f"work lost across the checkpoint: {before[-3:]} → {after[:3]}"
    # one vm_dir per node here: no live migration is possible, so the manager suspends at once
    relocated = next(e for e in events if e.kind == "relocation")
    assert relocated.detail["path"] == "suspend" and "shared vm_dir" in relocated.detail["reason"]
    resumed = next(e for e in events if e.kind == "resumed")
    print(
        f"\ncheckpoint signal: counter {before[-1]} → {after[0]} (nothing lost); nodes freed "
        f"{relocated.detail['freed_s']:.1f} s after OAR's warning, running at b after "
        f"{resumed.detail['since_warning_s']:.1f} s"
    )


def test_oarsub_interactive_takes_the_nodes_of_a_besteffort_vjob(env: Env) -> None:
    """A user's `oarsub -I` on a full site: OAR warns the vjob, and Saline, finding site b free,
    asks OAR for it there and live-migrates the VM (the hosts share the vm_dir here): the user
    gets the shell long before OAR's 60 s kill deadline, the guest never stops, nothing is
    written to the repository, the counter goes on without a gap. (The suspension path on a
    warning is the test above.)"""
    shells: list[InteractiveJob] = []

    def interactive(env: Env) -> Callable[[], None]:
        shell = InteractiveJob(
            env.oar.user, f"/resource_id={env.oar.resources_per_site},walltime=0:10:00", env.oar.properties("a")
        )
        shells.append(shell)
        return shell.close

    manager = env.manager(snapshot_period_s=3600, checkpoint_delay_s=60, shared_vms=True)
    before, after, job = _run_kill_resume(env, manager, fill=interactive)
    shell = shells[0]
    assert shell.started_after_s is not None, shell.output[-600:]
    assert shell.started_after_s < 60, f"the shell waited {shell.started_after_s:.0f} s: OAR's kill, not Saline"
    seen = OarCommands().job(shell.job_id or "")
    assert seen is not None and seen.job_type == "INTERACTIVE", seen
    events = journal.events(manager.ports.store, job.key)
    kinds = [e.kind for e in events]
    migrated = next(e for e in events if e.kind == "migrated")
    assert migrated.detail["path"] == "migrate_other_site" and migrated.detail["hosts"] == ["127.0.0.1"]
    assert "killed" not in kinds and "snapshot" not in kinds and job.kills == 0
    assert (
        manager.ports.sites["a"].repository.labels(job.key) == []
        and manager.ports.sites["b"].repository.labels(job.key) == []
    )
    # one console log (the hosts share the vm_dir): the counter ran on at b without a gap or a reboot
    assert after == list(range(1, len(after) + 1)), f"the counter jumped or restarted: {after}"
    assert after[-1] >= before[-1] + 2, f"it did not run on at b: {before[-3:]} → {after[-3:]}"
    ticks = after
    print(
        f"\noarsub -I: shell after {shell.started_after_s:.1f} s; live-migrated to b "
        f"{migrated.detail['since_warning_s']:.1f} s after OAR's warning (migration "
        f"{migrated.detail['migrate_s']:.1f} s); counter 1..{ticks[-1]} without a gap"
    )
