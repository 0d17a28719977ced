"""Resume on a host that shares no directory with the first: rsync over ssh, checked on arrival.

The second host (tests/services/second_host.py) has its VM and snapshot directories at the
same paths as the first, on a tmpfs only its namespace sees; the driver reaches it over ssh,
as it would a real node. One counter guest goes first → second → first:
- the resume on the second host succeeds, and its files are not on the first host's disk;
- a copy back whose bytes are altered on the way is refused with a clear error, nothing is
  started, and the snapshot on the second host is kept (and still verifies);
- a copy killed half-way (the real rsync, SIGKILLed mid-transfer) is retried and the guest
  resumes with its counter intact;
- a live migration (Driver.migrate) copies the disks, checked on arrival, and refuses a copy
  altered on the way, the guest running on at the source (test_5); a VM with a job disk
  defined on the second host gets its disk sent and checked, and migrates back with it (test_4).
The faults are made by a wrapper named `rsync` first on PATH that runs the real rsync. What the
shared ssh connections save and how fast a migration copies the disks against a plain rsync are
measured by bench/multinode_transfer.py (not here: speed belongs in the benches).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit import guest_probe
from devkit.guest_probe import wait_for_counter
from provisioning import guest, integrity, transfer
from provisioning.driver import Driver, DriverError, SnapshotError, VMSpec
from tests.services.second_host import SecondHost, second_host  # noqa: F401 - fixture
from vjob.config import ProvisioningConfig
from vjob.model import VMState

pytestmark = [pytest.mark.libvirt, pytest.mark.realvm]

VM = "vjob-mn-transfer"
TICK_TIMEOUT_S = 40.0
REAL_RSYNC = shutil.which("rsync") or "/usr/bin/rsync"

# Stand-ins for a bad network, around the real rsync. "$RSYNC_MODE" picks the fault; only the
# file whose name ends with "$RSYNC_HIT" (default: the memory state, *.state) is hit; every call
# is counted. A corrupted file has one byte changed in its middle, its size kept.
WRAPPER = """#!/bin/sh
echo "$*" >> "$RSYNC_CALLS"
case "$*" in
  *${{RSYNC_HIT:-.state}}\\ *) ;;
  *) exec {real} "$@" ;;
esac
if [ "$RSYNC_MODE" = kill-once ] && [ ! -e "$RSYNC_CALLS.killed" ]; then
  touch "$RSYNC_CALLS.killed"
  exec timeout -s KILL 1.5 {real} --bwlimit=8000 "$@"
fi
{real} "$@" || exit $?
if [ "$RSYNC_MODE" = corrupt ]; then
  for last; do :; done
  size=$(stat -c %s "$last")
  byte=$(dd if="$last" bs=1 skip=$((size / 2)) count=1 status=none | od -An -tu1 | tr -d ' ')
  next=$(printf %o $(((${{byte:-0}} + 1) % 256)))
  printf "\\\\$next" | dd of="$last" bs=1 seek=$((size / 2)) conv=notrunc status=none
fi
"""


def _console(host: SecondHost, driver: Driver, node: str, scratch: Path) -> Path:
    """The guest's console log on `node`, as a local file guest_probe can read."""
    path = driver.console_log(VM, node)
    if node == "a":
        return path
    local = scratch / "console-b.log"
    local.write_bytes(host.read_bytes(path))
    return local


def _wait_counter(host: SecondHost, driver: Driver, node: str, at_least: int, scratch: Path) -> list[int]:
    deadline = time.monotonic() + TICK_TIMEOUT_S
    while time.monotonic() < deadline:
        seen = guest_probe.counters(_console(host, driver, node, scratch))
        if seen and seen[-1] >= at_least:
            return seen
        time.sleep(0.5)
    raise AssertionError(f"counter {at_least} not reached on {node}")


@pytest.fixture(scope="module")
def setup(
    second_host: SecondHost,  # noqa: F811 - the fixture imported above
    libvirt_system: str,
    tiny_guest: guest.GuestFiles,
) -> Iterator[tuple[Driver, SecondHost, Path]]:
    work = Path(tempfile.mkdtemp(prefix="vjob-mn-", dir="/var/tmp"))
    work.chmod(0o755)
    image = work / "empty.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True, timeout=30)
    cfg = ProvisioningConfig(
        nodes={"a": libvirt_system, "b": second_host.uri},
        hosts={"a": "", "b": second_host.ssh_host},
        copy_method="rsync",
        vm_dir=str(second_host.root / "vms"),  # one path, two filesystems
        snapshot_dir=str(second_host.root / "snapshots"),
        migrate_uris={"a": "tcp://127.0.0.1", "b": "tcp://127.0.0.1"},  # both libvirtds are this machine
        operation_timeout_s=120,
    )
    driver = Driver(cfg, data_dir=work)
    spec = VMSpec(
        VM, image, memory_mib=128, kernel=tiny_guest.kernel, initrd=tiny_guest.initrd, cmdline=tiny_guest.cmdline
    )
    for node in ("a", "b"):
        driver.delete(VM, node)
    driver.define(spec, "a")
    driver.boot(VM, "a")
    wait_for_counter(driver.console_log(VM, "a"), 2, 90)
    try:
        yield driver, second_host, work
    finally:
        for node in ("a", "b"):
            driver.delete(VM, node)
        driver.close()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def faulty_rsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`rsync` first on PATH: the real one plus the fault named by $RSYNC_MODE; returns the call log."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "rsync"
    wrapper.write_text(WRAPPER.format(real=REAL_RSYNC))
    wrapper.chmod(0o755)
    calls = tmp_path / "rsync.calls"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("RSYNC_CALLS", str(calls))
    return calls


def test_1_resume_on_a_host_sharing_no_directory(setup: tuple[Driver, SecondHost, Path], tmp_path: Path) -> None:
    driver, host, _ = setup
    driver.save(VM, "a")
    before = guest_probe.last_counter(driver.console_log(VM, "a"))
    assert before is not None
    driver.restore(VM, "b", from_node="a")
    seen = _wait_counter(host, driver, "b", before + 2, tmp_path)
    assert seen[0] == before + 1, f"the guest did not continue where it stopped: {before} then {seen[:3]}"
    assert guest_probe.boots(_console(host, driver, "b", tmp_path)) == 0  # restored, never booted on b
    overlay = driver.overlay_path(VM, "b")
    assert host.exists(overlay) and not overlay.exists()  # b's overlay is on b's disk only
    assert not driver.state_path(VM, "a").exists()  # the source's state is gone once resumed
    assert driver.state(VM, "b") == VMState.RUNNING and driver.state(VM, "a") is None


def test_2_a_corrupted_copy_is_refused_and_the_source_kept(
    setup: tuple[Driver, SecondHost, Path], faulty_rsync: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver, host, _ = setup
    driver.save(VM, "b")  # a save on the remote host: renamed and hashed there, over ssh
    state_b = driver.state_path(VM, "b")
    assert host.exists(state_b) and host.exists(state_b.with_name(state_b.name + ".json"))
    assert not state_b.exists()  # nothing of it on this host
    monkeypatch.setenv("RSYNC_MODE", "corrupt")
    with pytest.raises(SnapshotError, match=r"does not match the snapshot recorded at save time.*corrupt.*kept"):
        driver.restore(VM, "a", from_node="b")
    assert ".state" in faulty_rsync.read_text()
    assert not driver.state_path(VM, "a").exists()  # the bad copy was removed, nothing started
    assert driver.state(VM, "a") is None
    assert driver.verify(VM, "b").size_bytes > 32 << 20  # the source is intact and still verifies
    # The overlay altered on the way, the state intact: caught by the digest recorded at save
    # time (provisioning.integrity.disk_digests), not by rsync (the change is made after it)
    monkeypatch.setenv("RSYNC_HIT", ".qcow2")
    overlay_b = driver.overlay_path(VM, "b")
    with pytest.raises(SnapshotError, match=rf"save time .*{overlay_b.name} is corrupt.*the snapshot on b is kept"):
        driver.restore(VM, "a", from_node="b")
    assert not overlay_b.exists() and not driver.state_path(VM, "a").exists()  # no copy left on a
    assert driver.state(VM, "a") is None
    recorded = integrity.recorded_disks(integrity.read_manifest(state_b, host.ssh_host))
    assert transfer.sha256(transfer.Endpoint(overlay_b, host.ssh_host)) == recorded["overlay"]["sha256"]  # b's intact


def test_3_a_copy_killed_half_way_is_retried(
    setup: tuple[Driver, SecondHost, Path], faulty_rsync: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    driver, host, _ = setup
    before = guest_probe.last_counter(_console(host, driver, "b", tmp_path))
    assert before is not None
    monkeypatch.setenv("RSYNC_MODE", "kill-once")
    driver.restore(VM, "a", from_node="b")
    state_calls = [line for line in faulty_rsync.read_text().splitlines() if ".state " in line + " "]
    assert Path(f"{faulty_rsync}.killed").exists() and len(state_calls) == 2, state_calls
    log = driver.console_log(VM, "a")
    wait_for_counter(log, before + 2, TICK_TIMEOUT_S)
    seen = guest_probe.counters(log)
    assert before + 1 in seen and seen[-1] >= before + 2
    assert not host.exists(driver.state_path(VM, "b"))  # the source dropped its copy only after the resume
    assert driver.state(VM, "a") == VMState.RUNNING


def test_4_a_vm_defined_on_the_second_host_gets_its_job_disk_sent_and_checked(
    setup: tuple[Driver, SecondHost, Path],
    tiny_guest: guest.GuestFiles,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A multi-node pilot builds every VM's job disk on its own node; without a shared vm_dir,
    `define` on the second host creates the overlay there and sends the job disk, checked on
    arrival: a copy altered on the way is refused (removed there, kept here), a good one boots."""
    driver, host, work = setup
    vm = f"{VM}-jd"
    driver.delete(vm, "b")
    disk = driver.job_disk_path(vm, "b")  # built here, at the node's path, as the pilot does
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "16M"], check=True, timeout=30)
    built = transfer.sha256_file(disk)
    spec = VMSpec(
        vm,
        work / "empty.qcow2",
        memory_mib=96,
        kernel=tiny_guest.kernel,
        initrd=tiny_guest.initrd,
        cmdline=tiny_guest.cmdline,
        job_disk=disk,
    )
    real_copy = transfer.copy

    def altered_on_the_way(src: transfer.Endpoint, dst: transfer.Endpoint, **kw: object) -> None:
        real_copy(src, dst, **kw)  # type: ignore[arg-type]
        host.run(f"printf x | dd of={shlex.quote(str(dst.path))} bs=1 seek=100 conv=notrunc status=none")

    monkeypatch.setattr(transfer, "copy", altered_on_the_way)
    with pytest.raises(DriverError, match=r"job disk sent to \S+ does not match the one built .*is corrupt.*kept"):
        driver.define(spec, "b")
    assert not host.exists(disk) and transfer.sha256_file(disk) == built  # removed there, intact here
    assert driver.state(vm, "b") is None  # nothing defined
    monkeypatch.setattr(transfer, "copy", real_copy)
    try:
        driver.define(spec, "b")
        assert not disk.exists()  # the node's copy is the VM's disk now
        assert transfer.sha256(transfer.Endpoint(disk, host.ssh_host)) == built
        assert host.exists(driver.overlay_path(vm, "b")) and not driver.overlay_path(vm, "b").exists()
        driver.define(spec, "b")  # repeated (a pilot restarted): nothing to send, nothing refused
        driver.boot(vm, "b")  # QEMU on the second host opens both disks there
        console = tmp_path / "console-jd.log"
        deadline = time.monotonic() + TICK_TIMEOUT_S
        while time.monotonic() < deadline and not guest_probe.counters(console):
            time.sleep(0.5)
            console.write_bytes(host.read_bytes(driver.console_log(vm, "b")))
        assert guest_probe.counters(console), "the guest defined on the second host did not run"
        # migrated back with its job disk (test_5's guest has none): the disk copied and checked
        # on arrival, b's copy removed, the guest counting on at a where it stopped at b
        sent = transfer.sha256(transfer.Endpoint(disk, host.ssh_host))
        assert driver.migrate(vm, "b", "a") is False  # TCG: paused for the copy
        assert driver.state(vm, "a") == VMState.RUNNING and driver.state(vm, "b") is None
        assert transfer.sha256_file(disk) == sent and not host.exists(disk)
        console.write_bytes(host.read_bytes(driver.console_log(vm, "b")))  # the source's log stays
        last = guest_probe.last_counter(console)
        assert last is not None
        wait_for_counter(driver.console_log(vm, "a"), last + 1, TICK_TIMEOUT_S)
    finally:
        driver.delete(vm, "a")
        driver.delete(vm, "b")
        disk.unlink(missing_ok=True)


def _tail_counters(host: SecondHost, driver: Driver, node: str, offset: int, scratch: Path) -> list[int]:
    """The counters the guest printed on `node` after byte `offset` of its console log there."""
    return guest_probe.split_counters(_console(host, driver, node, scratch), offset)[1]


def _log_size(host: SecondHost, driver: Driver, node: str, scratch: Path) -> int:
    return _console(host, driver, node, scratch).stat().st_size if node == "b" else _local_size(driver, node)


def _local_size(driver: Driver, node: str) -> int:
    path = driver.console_log(VM, node)
    return path.stat().st_size if path.exists() else 0


def _migrated_and_counting(
    host: SecondHost, driver: Driver, src: str, dst: str, scratch: Path
) -> tuple[int, list[int]]:
    """Migrate the counter guest `src` → `dst`; the last counter it printed on `src` and those
    it printed on `dst` since."""
    offset = _log_size(host, driver, dst, scratch)
    assert driver.migrate(VM, src, dst) is False  # TCG: paused for the copy, as the defect requires
    before = guest_probe.last_counter(_console(host, driver, src, scratch))  # the source's log stays
    assert before is not None
    deadline = time.monotonic() + TICK_TIMEOUT_S
    after: list[int] = []
    while time.monotonic() < deadline and len(after) < 2:
        time.sleep(0.5)
        after = _tail_counters(host, driver, dst, offset, scratch)
    return before, after


def test_5_a_live_migration_copies_the_disks_to_a_host_sharing_no_directory(
    setup: tuple[Driver, SecondHost, Path], faulty_rsync: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`migrate` between hosts with no common VM directory: the overlay is copied while the
    guest is paused, checked on arrival, and removed from the source; a copy altered on the way
    is refused and the guest runs on where it was. a → b, a refused b → a, b → a, then a → b
    live (the disks mirrored by QEMU)."""
    driver, host, _ = setup
    overlay = driver.overlay_path(VM, "a")  # one path, a file of each host's own
    assert driver.state(VM, "a") == VMState.RUNNING and not host.exists(overlay)
    before, after = _migrated_and_counting(host, driver, "a", "b", tmp_path)
    assert after[:2] == [before + 1, before + 2], f"not continued: {before} on the source, then {after}"
    assert driver.state(VM, "b") == VMState.RUNNING and driver.state(VM, "a") is None
    assert host.exists(overlay) and not overlay.exists()  # its disk is on b only: nothing read from a
    assert ".qcow2" in faulty_rsync.read_text()  # the overlay travelled by the copy method
    # back, with the overlay altered after rsync wrote it on a: refused, removed on a, still on b
    monkeypatch.setenv("RSYNC_MODE", "corrupt")
    monkeypatch.setenv("RSYNC_HIT", ".qcow2")
    running = guest_probe.last_counter(_console(host, driver, "b", tmp_path))
    refused = r"do not match the source's .*is corrupt.*removed from a, the VM runs on at b"
    with pytest.raises(DriverError, match=refused):
        driver.migrate(VM, "b", "a")
    assert not overlay.exists() and driver.state(VM, "a") is None
    assert driver.state(VM, "b") == VMState.RUNNING and host.exists(overlay)
    assert running is not None
    _wait_counter(host, driver, "b", running + 2, tmp_path)  # unpaused: it keeps counting on b
    monkeypatch.setenv("RSYNC_MODE", "")
    before, after = _migrated_and_counting(host, driver, "b", "a", tmp_path)
    assert after[:2] == [before + 1, before + 2], f"not continued: {before} on the source, then {after}"
    assert driver.state(VM, "a") == VMState.RUNNING and driver.state(VM, "b") is None
    assert overlay.exists() and not host.exists(overlay)
    # The live branch (KVM's; forced here on TCG, safe for this guest, which writes little
    # memory): libvirt's non-shared-storage migration, QEMU mirroring the disks over NBD
    offset = _log_size(host, driver, "b", tmp_path)
    assert driver.migrate(VM, "a", "b", live=True) is True
    before = guest_probe.last_counter(driver.console_log(VM, "a"))
    _wait_counter(host, driver, "b", (before or 0) + 2, tmp_path)
    assert _tail_counters(host, driver, "b", offset, tmp_path)[:2] == [(before or 0) + 1, (before or 0) + 2]
    assert host.exists(overlay) and not overlay.exists() and driver.state(VM, "a") is None
