"""Moves between two hosts that share no directory: what shared ssh connections save, and how
fast a migration's disk copy runs beside a plain rsync of the same files (docs/multinode.md, "No
shared filesystem" and "Live migration without a shared directory").

The hosts are the test suite's: this machine's system libvirtd (node a) and the second libvirtd
in its own namespace with its own VM and snapshot directories on a tmpfs only it sees, reached
over ssh (node b; tests/services/second_host.py). Both parts run in one process, each against
its peer in the same run, on the counter guest (no image to build but the tiny guest's):

1. `ssh`: a 128 MiB guest saved and resumed a -> b -> a, `--rounds` times with ssh connections
   shared (`provisioning.transfer.SHARE_CONNECTIONS`, one master per host) and as many without,
   alternated, each round from no master, as a fresh driver starts. Per step the median seconds
   of each kind and shared / plain.
2. `migrate`: a guest with a 256 MiB job disk of random bytes migrated a -> b -> a (TCG: paused,
   its disks copied by the copy method and checked on arrival), each leg just after a plain rsync
   of the same files over the same link (a fresh ssh connection). Per leg the MB moved, the
   migration's seconds split into its parts (hash at the source, copy, hash on arrival, memory)
   and the copy's and the whole migration's time over the plain rsync's.

Every figure is printed as it comes (stderr); the last line on stdout is one JSON object. Speed
here is shared with everything else on the machine's 2 cores: compare the ratios, not the rates.
As root (the system libvirtd), not inside a test run's namespaces:

    PYTHONPATH=. .venv/bin/python bench/multinode_transfer.py [--rounds 2] [--disk-mib 256]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devkit import libvirtd
from devkit.guest_probe import wait_for_counter
from provisioning import guest, integrity, migration, transfer
from provisioning.driver import Driver, VMSpec
from tests.services import second_host as sh
from tests.services.libvirt import SECOND_NODE_DIR
from vjob.config import ProvisioningConfig
from vjob.model import VMState

VM = "vjob-bench-mn-transfer"


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[Driver, sh.SecondHost, Path]]:
    """The test suite's two hosts and a driver for them (nodes a and b), as
    tests/test_multinode_transfer.py's set-up makes them; what was started here is stopped."""
    logs = Path(tempfile.mkdtemp(prefix="vjob-bench-mnt-log-"))
    system = libvirtd.start_system(logs)
    second = libvirtd.start_second_node(SECOND_NODE_DIR)
    work = Path(tempfile.mkdtemp(prefix="vjob-bench-mnt-", dir="/var/tmp"))
    work.chmod(0o755)
    try:
        # the fixture's own generator (pytest's wrapper forbids calling the fixture itself)
        with contextlib.contextmanager(sh.second_host.__wrapped__)(second.uri) as host:
            cfg = ProvisioningConfig(
                nodes={"a": system.uri, "b": host.uri},
                hosts={"a": "", "b": host.ssh_host},
                copy_method="rsync",
                vm_dir=str(host.root / "vms"),  # one path, two filesystems
                snapshot_dir=str(host.root / "snapshots"),
                migrate_uris={"a": "tcp://127.0.0.1", "b": "tcp://127.0.0.1"},
                operation_timeout_s=300,
            )
            driver = Driver(cfg, data_dir=work)
            try:
                yield driver, host, work
            finally:
                driver.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if second.owned:  # as the test suite's fixture: its virtlogd too
            libvirtd.stop(second, virtlogd_pidfile=SECOND_NODE_DIR / "run" / "virtlogd.pid")
        libvirtd.stop(system)
        shutil.rmtree(logs, ignore_errors=True)


def _say(what: str, figures: object) -> None:
    print(f"{what}: {json.dumps(figures)}", file=sys.stderr, flush=True)


def _spec(work: Path, files: guest.GuestFiles, name: str, job_disk: Path | None = None) -> VMSpec:
    image = work / "empty.qcow2"
    if not image.exists():
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True, timeout=30)
    return VMSpec(
        name,
        image,
        memory_mib=128,
        kernel=files.kernel,
        initrd=files.initrd,
        cmdline=files.cmdline,
        job_disk=job_disk,
    )


def shared_connections(driver: Driver, spec: VMSpec, rounds: int) -> dict[str, Any]:
    """Save and resume a -> b -> a, plain and shared alternated `rounds` times each: per step the
    median seconds of each kind and shared / plain."""
    driver.define(spec, "a")
    driver.boot(spec.name, "a")
    wait_for_counter(driver.console_log(spec.name, "a"), 2, 120)
    seen: dict[str, dict[str, list[float]]] = {"plain": {}, "shared": {}}
    try:
        for share in (False, True) * rounds:
            transfer.SHARE_CONNECTIONS = share
            transfer.close_connections()  # every round starts without a master, as a fresh driver does
            kind = seen["shared" if share else "plain"]
            for src, dst in (("a", "b"), ("b", "a")):
                start = time.monotonic()
                driver.save(spec.name, src)
                saved = time.monotonic()
                driver.restore(spec.name, dst, from_node=src)
                kind.setdefault(f"save_{src}_s", []).append(saved - start)
                kind.setdefault(f"resume_{src}_to_{dst}_s", []).append(time.monotonic() - saved)
                if driver.state(spec.name, dst) != VMState.RUNNING:
                    raise RuntimeError(f"{spec.name} not running on {dst} after its resume from {src}")
            _say("ssh round", {"shared": share, **{k: round(v[-1], 2) for k, v in kind.items()}})
    finally:
        transfer.SHARE_CONNECTIONS = True
        transfer.close_connections()
        for node in ("a", "b"):
            driver.delete(spec.name, node)
    out: dict[str, Any] = {"rounds": rounds}
    for step in seen["plain"]:
        plain, shared = statistics.median(seen["plain"][step]), statistics.median(seen["shared"][step])
        out[step] = {
            "plain": round(plain, 2),
            "shared": round(shared, 2),
            "shared_over_plain": round(shared / plain, 2),
        }
    return out


def _plain_rsync(host: sh.SecondHost, files: list[Path], src: str, scratch: Path) -> float:
    """Seconds of one plain rsync of `files` (each at the same path on both hosts) from `src` to
    the other host's scratch directory, over a fresh ssh connection (no control master)."""
    shell = f"ssh -o BatchMode=yes -o ControlMaster=no -F {host.ssh_config}"
    if src == "a":
        argv = ["rsync", "-t", "-e", shell, *map(str, files), f"{host.ssh_host}:{scratch}/"]
        host.run("mkdir", "-p", str(scratch))
    else:
        scratch.mkdir(parents=True, exist_ok=True)
        argv = ["rsync", "-t", "-e", shell, *(f"{host.ssh_host}:{f}" for f in files), f"{scratch}/"]
    start = time.monotonic()
    subprocess.run(argv, check=True, timeout=900)
    took = time.monotonic() - start
    if src == "a":
        host.run("rm", "-rf", "--", str(scratch))
    else:
        shutil.rmtree(scratch)
    return took


@contextlib.contextmanager
def _clocked(phases: dict[str, float]) -> Iterator[None]:
    """The migration's parts timed in place (the copy, the hashes, the memory): the module
    functions wrapped for the duration, put back after."""
    saved = (transfer.copy, integrity.disk_digests, integrity.check_disks, migration._send_memory)

    def clock(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kw: Any) -> Any:
            start = time.monotonic()
            try:
                return fn(*args, **kw)
            finally:
                phases[name] = phases.get(name, 0.0) + time.monotonic() - start

        return run

    transfer.copy = clock("copy_s", saved[0])  # type: ignore[assignment]
    migration.integrity.disk_digests = clock("hash_source_s", saved[1])  # type: ignore[assignment]
    migration.integrity.check_disks = clock("hash_arrival_s", saved[2])  # type: ignore[assignment]
    migration._send_memory = clock("memory_s", saved[3])  # type: ignore[assignment]
    try:
        yield
    finally:
        transfer.copy, integrity.disk_digests, integrity.check_disks, migration._send_memory = saved  # type: ignore[assignment]


def migration_copy(
    driver: Driver, host: sh.SecondHost, work: Path, files: guest.GuestFiles, disk_mib: int
) -> dict[str, Any]:
    """A guest with a `disk_mib` job disk of random bytes migrated a -> b -> a, each leg after a
    plain rsync of the same files: per leg the MB, the parts, and the ratios to the rsync."""
    name = f"{VM}-rate"
    raw = work / "random.raw"
    raw.write_bytes(os.urandom(disk_mib << 20))
    disk = driver.job_disk_path(name, "a")
    subprocess.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(disk)], check=True)
    raw.unlink()
    legs: dict[str, Any] = {}
    try:
        driver.define(_spec(work, files, name, disk), "a")
        driver.boot(name, "a")
        wait_for_counter(driver.console_log(name, "a"), 2, 120)
        for src, dst in (("a", "b"), ("b", "a")):
            paths = list(driver.disk_paths(name, src).values())
            where = host.ssh_host if src == "b" else None
            mb = sum(transfer.size(transfer.Endpoint(f, where)) or 0 for f in paths) / 1e6
            rsync_s = _plain_rsync(host, paths, src, work / "plain")
            phases: dict[str, float] = {}
            with _clocked(phases):
                start = time.monotonic()
                driver.migrate(name, src, dst)
                took = time.monotonic() - start
            if driver.state(name, dst) != VMState.RUNNING:
                raise RuntimeError(f"{name} not running on {dst} after its migration from {src}")
            legs[f"{src}_to_{dst}"] = {
                "mb": round(mb, 1),
                "plain_rsync_s": round(rsync_s, 2),
                "migration_s": round(took, 2),
                **{k: round(v, 2) for k, v in sorted(phases.items())},
                "copy_over_plain_rsync": round(phases.get("copy_s", 0.0) / rsync_s, 2),
                "migration_over_plain_rsync": round(took / rsync_s, 2),
            }
            _say("migration leg", {f"{src}_to_{dst}": legs[f"{src}_to_{dst}"]})
    finally:
        for node in ("a", "b"):
            driver.delete(name, node)
    return legs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each kind (plain, shared), alternated")
    parser.add_argument("--disk-mib", type=int, default=256, help="the migrated guest's job disk of random bytes")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/multinode_transfer.py runs as root (the system libvirtd, a namespace's tmpfs)", file=sys.stderr)
        return 2
    files = guest.build()
    load = os.getloadavg()[0]
    with two_hosts() as (driver, host, work):
        for node in ("a", "b"):
            driver.delete(VM, node)
        ssh = shared_connections(driver, _spec(work, files, VM), args.rounds)
        moved = migration_copy(driver, host, work, files, args.disk_mib)
    print(
        json.dumps(
            {
                "figure": "multinode_transfer",
                "ssh": ssh,
                "migrate": moved,
                "resume_a_to_b_shared_over_plain": ssh["resume_a_to_b_s"]["shared_over_plain"],
                "migration_copy_over_plain_rsync": round(
                    statistics.median(leg["copy_over_plain_rsync"] for leg in moved.values()), 2
                ),
                "load_1min": [round(load, 1), round(os.getloadavg()[0], 1)],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
