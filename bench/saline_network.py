"""Two VMs of one Saline vjob talking on their private network, before and after a resume elsewhere.

Root only (root's libvirt; a second libvirtd of our own acts as the other site's node). The
vjob runs the real `debian12` image (`vjob image build`, cached by content): each VM gets a job
disk with its address on the vjob's network (`vsal-<subnetID>`, MAC and IP from the store's
subnetID/vmID), the vjob's ssh key, and the first VM runs COMMAND as the user:

    every second: ssh vm1 (the second VM, by the IP the allocator gave it), print the answer

That is TCP both ways (ssh's key exchange, a command, its output) between the two guests over
their bridge. The manager's own code drives the life: deploy (`deployment.deploy`) at node a,
OAR's checkpoint warning handled as it is when no other site has room (`evacuation.evacuate`:
one coordinated cut of both VMs into site a's repository, job disks included, nodes freed),
then the resume at node b, on the other libvirtd, from site a's repository
(`deployment.deploy` → `SalineVMs.restore`: both restored paused, then let run together). OAR is
not involved (its part is what test_saline_e2e runs); its client here points at nothing.

Figures: boot → first exchange, the cut, restore → running, restore → first exchange after the
resume, the exchange counter across the move (it must continue: the guest did not reboot and
no exchange is lost or repeated), and whether both VMs kept their MAC on the same bridge.
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from devkit.saline_bench import (
    USER,
    SecondNode,
    evacuate_keeping_output,
    leased_job,
    numbered_lines,
    require_root,
    saline_bench,
    wait_for,
)
from plugins.oar.parse import OarJob
from provisioning import network
from provisioning.driver import Driver
from saline_bew import deployment, identity, journal
from saline_bew.manager import Manager
from vjob import progress

COMMAND = [
    "sh",
    "-c",
    'i=0; while true; do i=$((i+1)); a=$(ssh -o ConnectTimeout=5 vm1 "cat /proc/sys/kernel/hostname" 2>&1); '
    'echo "EXCHANGE $i $(date +%s) $a"; sleep 1; done',
]
LINE = re.compile(r"EXCHANGE (\d+) (\d+) (.*)")


def exchanges(log: Path) -> list[tuple[int, str]]:
    """(counter, what vm1 answered) of every exchange the first VM printed so far."""
    return numbered_lines(log, LINE)


def wait_exchanges(log: Path, predicate: Any, timeout_s: float, what: str) -> float:
    return wait_for(lambda: predicate(exchanges(log)), timeout_s, f"{what} ({log})")


def _step(bar: progress.Progress, text: str) -> None:
    """One of the bench's four stages begins (a line on a log, the bar's label on a terminal)."""
    bar.relabel(text)
    bar.advance()


def nics(driver: Driver, vm: str, node: str) -> list[tuple[str | None, str | None]]:
    root = ET.fromstring(driver.connection(node).lookupByName(vm).XMLDesc(0))
    return [
        (nic.find("mac").get("address"), nic.find("source").get("bridge"))  # type: ignore[union-attr]
        for nic in root.findall("./devices/interface[@type='bridge']")
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--boot-timeout", type=float, default=600.0)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    require_root("root's libvirt and a second libvirtd")
    figures: dict[str, Any] = {"bench": "saline_network", "image": "debian12", "vms": 2}
    with (
        progress.Progress(4, "saline network bench") as bar,
        saline_bench("saline-net", bar, figures, second=SecondNode("salineb", (49330, 49350)), keep=args.keep) as b,
    ):
        figures.update(run(b.manager, b.driver, args, bar))
    print(json.dumps(figures))


def run(manager: Manager, driver: Driver, args: argparse.Namespace, bar: progress.Progress) -> dict[str, Any]:
    store = manager.ports.store
    job = leased_job(manager, "be5a11e0e7a1", COMMAND, vm_count=2, memory_mb=384)
    ids = identity.assign(
        store, site="a", job_key=job.key, vm_names=job.vm_names, mac_prefix="52:54:00", network="10.0.0.0/8"
    )
    bridge = network.bridge_name(ids[0].subnet_id, network.SALINE_FAMILY)
    job = journal.record(store, job.key, "submitted", oar_job_id="1")
    out: dict[str, Any] = {"bridge": bridge, "ips": [i.ip for i in ids], "macs": [i.mac for i in ids]}
    try:
        _step(bar, f"deploy both VMs at node na on {bridge} ({ids[0].ip}, {ids[1].ip})")
        t0 = time.monotonic()
        deployment.deploy(manager.ports, job, OarJob(id="1", state="Running", user=USER, hosts=("na",)))
        log_a = driver.output_logs(job.vm_names[0], "na")[0]
        wait_exchanges(log_a, lambda ex: any(a == "vm1" for _, a in ex), args.boot_timeout, "first exchange at na")
        out["boot_to_first_exchange_s"] = round(time.monotonic() - t0, 1)
        wait_exchanges(log_a, lambda ex: sum(a == "vm1" for _, a in ex) >= 3, 300, "three exchanges at na")
        out["macs_at_a"] = [nics(driver, vm, "na") for vm in job.vm_names]
        _step(bar, "OAR's warning, no site with room: one cut of both VMs into site a's repository")
        kept, took = evacuate_keeping_output(manager, job.key, log_a)
        out["warning_to_nodes_freed_s"] = round(took, 1)
        job, log_a = journal.get(store, job.key), kept
        before = exchanges(log_a)
        out["last_exchange_before"] = before[-1][0]
        snap = next(e for e in reversed(journal.events(store, job.key)) if e.kind == "snapshot")
        out["suspend_s"] = snap.detail["took_s"]
        out["snapshot_mb"] = round(snap.detail["bytes"] / 2**20, 1)
        _step(bar, "resume at node nb (the other libvirtd) from site a's repository")
        job = journal.record(store, job.key, "test", oar_job_id="2", site="b")
        t1 = time.monotonic()
        running_at_b = OarJob(id="2", state="Running", user=USER, hosts=("nb",))
        deployment.deploy(manager.ports, journal.get(store, job.key), running_at_b)
        resumed = journal.events(store, job.key)[-1]
        out["restore_to_running_s"] = resumed.detail.get("restore_to_running_s")
        out["deploy_b_s"] = round(time.monotonic() - t1, 1)
        log_b = driver.output_logs(job.vm_names[0], "nb")[0]
        last = out["last_exchange_before"]
        wait_exchanges(
            log_b, lambda ex: any(n > last and a == "vm1" for n, a in ex), 300, "an exchange after the resume"
        )
        out["resume_to_exchange_s"] = round(time.monotonic() - t1, 1)
        wait_exchanges(log_b, lambda ex: sum(n > last and a == "vm1" for n, a in ex) >= 3, 300, "three exchanges at nb")
        out["first_exchange_after"] = min(n for n, _ in exchanges(log_b))
        out["macs_at_b"] = [nics(driver, vm, "nb") for vm in job.vm_names]
        out["same_macs_and_bridge"] = out["macs_at_a"] == out["macs_at_b"] == [[(i.mac, bridge)] for i in ids]
        out["answers_after"] = sorted({a for _, a in exchanges(log_b)})
        out["failed_exchanges"] = sum(a != "vm1" for _, a in exchanges(log_a) + exchanges(log_b))
        out["counter_continues"] = out["first_exchange_after"] == last + 1  # no reboot, nothing lost or repeated
        out["ok"] = bool(out["same_macs_and_bridge"] and out["counter_continues"]) and out["answers_after"] == ["vm1"]
    finally:
        now_job = journal.get(store, job.key)
        for vm, node in zip(now_job.vm_names, now_job.hosts or ("na", "na"), strict=False):
            driver.delete(vm, node)
        for node in ("na", "nb"):
            manager.ports.vms.network_down(ids[0].subnet_id, [node])
    return out


if __name__ == "__main__":
    main()
