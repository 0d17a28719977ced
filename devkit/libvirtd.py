"""Starting and stopping libvirt's daemons on a machine without systemd.

Why by hand: development machines and CI containers here have no systemd, and apt never
starts services (policy-rc.d says 101). libvirtd runs in the foreground under `tini -s`
because PID 1 here reaps orphans only every ~1.7 s and libvirtd waits for each QEMU pid to
vanish: without a child subreaper every destroy/save/migration costs 1.5 s more.

A second libvirtd ("a second node") runs in its own mount + UTS namespace with private
/etc|/run|/var/lib|/var/cache|/var/log libvirt directories, its own host_uuid and its own
migration port range, reached through `qemu+unix:///system?socket=<dir>/run/libvirt-sock`.
Live migration between the two behaves as between two hosts sharing one filesystem.

Only what a call started is reported in its `Daemons`, and `stop()` stops only those pids:
a libvirtd someone else runs is used as it is and never stopped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from provisioning import kvm_access
from vjob import proc
from vjob.errors import VjobError

SYSTEM_URI = "qemu:///system"
VIRTLOGD_SOCK = Path("/run/libvirt/virtlogd-sock")
START_TIMEOUT_S = 60.0
SECOND_NODE_UUID = "b0b0b0b0-0000-4000-8000-00000000000b"

# Runs inside the new mount namespace of a second node: bind its private directories over
# the standard libvirt ones, start its virtlogd, then become its libvirtd. Constant text;
# the directory comes in as "$1", never spliced into the script.
_SECOND_NODE_SCRIPT = r"""
set -e
B="$1"
hostname "$2"
mount --bind "$B/etc" /etc/libvirt
mount --bind "$B/run" /run/libvirt
mount --bind "$B/lib" /var/lib/libvirt
mount --bind "$B/cache" /var/cache/libvirt
mount --bind "$B/log" /var/log/libvirt
virtlogd -d -p /run/libvirt/virtlogd.pid
exec libvirtd -p /run/libvirt/libvirtd.pid
"""


@dataclass
class Daemons:
    """The daemons one call started: pids to stop later, and the URI to reach libvirtd."""

    uri: str
    started_pids: list[int] = field(default_factory=list)
    log_path: Path | None = None

    @property
    def owned(self) -> bool:
        return bool(self.started_pids)


def reachable(uri: str, timeout_s: float = 10.0) -> bool:
    """True when a libvirt daemon answers at `uri` (checked with virsh, in a subprocess).

    Why virsh rather than libvirt.open here: a failed open of a local URI may make libvirt
    try to autostart a daemon in-process; virsh in a child process keeps that out of ours.
    """
    try:
        res = subprocess.run(
            ["virsh", "-c", uri, "version"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0


def _wait(uri: str, timeout_s: float, proc: subprocess.Popen[bytes] | None, log_path: Path | None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if reachable(uri):
            return
        if proc is not None and proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-600:] if log_path and log_path.exists() else ""
            raise VjobError(f"libvirtd for {uri} exited with status {proc.returncode} while starting: {tail.strip()}")
        time.sleep(0.2)
    raise VjobError(f"libvirtd for {uri} did not answer within {timeout_s:.0f} s")


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _require(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise VjobError(
            f"{', '.join(missing)} not found: apt-get install libvirt-daemon-system libvirt-clients tini util-linux"
        )


def start_system(log_dir: Path, timeout_s: float = START_TIMEOUT_S) -> Daemons:
    """Make sure virtlogd and libvirtd serve qemu:///system; start what is missing.

    Returns the pids of what this call started (empty when both were already running).
    """
    _require("virtlogd", "libvirtd", "tini", "virsh")
    if os.geteuid() == 0:
        # No udev here: a root-only /dev/kvm makes libvirt re-probe QEMU at every domain start
        # (seconds each, and now and then a failed define); Debian's rule fixes it.
        kvm_access.grant_kvm_group()
    daemons = Daemons(uri=SYSTEM_URI)
    if not VIRTLOGD_SOCK.exists() or not _virtlogd_alive():
        pidfile = Path("/run/virtlogd.pid")
        _run(["virtlogd", "-d", "-p", str(pidfile)])
        pid = _wait_pidfile(pidfile)
        daemons.started_pids.append(pid)
    if reachable(SYSTEM_URI):
        return daemons
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "libvirtd.log"
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            ["tini", "-s", "--", "libvirtd"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    daemons.log_path = log_path
    try:
        _wait(SYSTEM_URI, timeout_s, proc, log_path)
    except VjobError:
        if proc.poll() is not None and reachable(SYSTEM_URI):
            # Another process started libvirtd at the same moment and won the pidfile.
            return daemons
        stop(Daemons(uri=SYSTEM_URI, started_pids=[proc.pid, *daemons.started_pids]))
        raise
    daemons.started_pids.insert(0, proc.pid)
    return daemons


def _virtlogd_alive() -> bool:
    pid = _read_pid(Path("/run/virtlogd.pid"))
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_pidfile(path: Path, timeout_s: float = 10.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = _read_pid(path)
        if pid is not None:
            return pid
        time.sleep(0.05)
    raise VjobError(f"{path} not written within {timeout_s:.0f} s")


def second_node_uri(base: Path) -> str:
    """The libvirt URI of the second node whose private directories live under `base`."""
    return f"qemu+unix:///system?socket={base / 'run' / 'libvirt-sock'}"


def _prepare_second_node(base: Path, migration_ports: tuple[int, int]) -> None:
    for sub in ("etc", "run", "lib", "cache", "log"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    if (base / "etc" / "libvirtd.conf").exists():
        return
    shutil.copytree("/etc/libvirt", base / "etc", dirs_exist_ok=True, symlinks=True)
    for xml in (base / "etc" / "qemu").glob("*.xml"):
        xml.unlink()  # never inherit the first node's persistent domains
    with open(base / "etc" / "libvirtd.conf", "a") as conf:
        conf.write(f'\nhost_uuid = "{SECOND_NODE_UUID}"\n')
    with open(base / "etc" / "qemu.conf", "a") as conf:
        conf.write(
            f"\nmigration_port_min = {migration_ports[0]}\nmigration_port_max = {migration_ports[1]}\n"
            "cgroup_controllers = [ ]\n"
        )
    qemu_lib = base / "lib" / "qemu"
    for sub in ("channel/target", "checkpoint", "dump", "nvram", "ram", "save", "snapshot"):
        (qemu_lib / sub).mkdir(parents=True, exist_ok=True)
    _run(["chown", "-R", "libvirt-qemu:libvirt-qemu", str(qemu_lib)])
    qemu_lib.chmod(0o750)


def start_second_node(
    base: Path,
    *,
    hostname: str = "nodeb",
    migration_ports: tuple[int, int] = (49300, 49320),
    timeout_s: float = START_TIMEOUT_S,
) -> Daemons:
    """Start (if not running) a second libvirtd acting as another node; `base` holds its state.

    Its migration ports must not overlap the first node's (49152-49215 by default).
    """
    _require("virtlogd", "libvirtd", "tini", "virsh", "unshare")
    base = base.resolve()
    uri = second_node_uri(base)
    if reachable(uri):
        return Daemons(uri=uri)
    _prepare_second_node(base, migration_ports)
    _stop_leftover_virtlogd(base / "run" / "virtlogd.pid")
    log_path = base / "log" / "libvirtd.stdout"
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--uts",
                "--propagation",
                "private",
                "--",
                "tini",
                "-s",
                "--",
                "/bin/sh",
                "-c",
                _SECOND_NODE_SCRIPT,
                "vjob-second-node",
                str(base),
                hostname,
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    daemons = Daemons(uri=uri, started_pids=[proc.pid], log_path=log_path)
    try:
        _wait(uri, timeout_s, proc, log_path)
    except VjobError:
        stop(daemons, virtlogd_pidfile=base / "run" / "virtlogd.pid")
        raise
    vl = _read_pid(base / "run" / "virtlogd.pid")
    if vl is not None:
        daemons.started_pids.append(vl)
    return daemons


def _stop_leftover_virtlogd(pidfile: Path) -> None:
    """A second node's libvirtd that was killed without `stop` (a run interrupted by hand) leaves
    its virtlogd holding `pidfile`, and the next start then fails with "Unable to obtain
    pidfile". The node is ours (its directory is), so its leftover is stopped by that pid — only
    if the process is still a virtlogd, never a pid the system gave to something else since."""
    pid = _read_pid(pidfile)
    if pid is None:
        return
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return
    if comm == "virtlogd":
        proc.stop_pid(pid, grace_s=10.0)


def stop(daemons: Daemons, *, virtlogd_pidfile: Path | None = None, timeout_s: float = 20.0) -> None:
    """Stop, by pid, what `daemons` says was started (libvirtd first, then virtlogd)."""
    pids = list(daemons.started_pids)
    if virtlogd_pidfile is not None:
        extra = _read_pid(virtlogd_pidfile)
        if extra is not None and extra not in pids:
            pids.append(extra)
    for pid in pids:
        proc.stop_pid(pid, grace_s=timeout_s)
    daemons.started_pids.clear()


def _run(cmd: list[str], timeout_s: float = 60.0) -> str:
    return proc.run(cmd, timeout_s=timeout_s)
