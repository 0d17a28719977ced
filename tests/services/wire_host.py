"""A second host across a (virtual) wire: its own network namespace, libvirtd, sshd and files.

Why beyond tests/services/second_host.py: that host is a mount namespace sharing this
machine's network stack, so everything "sent" to it goes over loopback. Here the host is a
network namespace of its own (`vjob-hostw`, eth0 = 198.18.251.2/24, joined by one veth pair
to this machine's end `vjh-w` = 198.18.251.1/24; RFC 2544's benchmarking range, never routed
anywhere, and apart from the two-host dev cluster's 198.18.250.0/24 so both can be up at
once) AND a persistent mount + UTS namespace (a holder, `sleep infinity` under `unshare`),
built the way devkit.devcluster_hosts builds the dev cluster's hosts, with its helpers:

- tmpfs over libvirt's run, cache and log directories, a copy of /etc/libvirt with its own
  host_uuid and a /var/lib/libvirt of its own: its own virtlogd and system libvirtd, whose QEMUs
  run in the host's network namespace;
- its own sysfs (its network devices: the bridges its libvirtd makes are in its namespace);
- a tmpfs over `root` (a directory whose path exists on both hosts): the host's VM, snapshot
  and repository directories, at the paths the first host uses for its own;
- an sshd on port 22 of its address, a key made for the run (`VJOB_SSH_CONFIG` names the
  config that reaches it as `vjob-hostw`).

libvirt is reached through that sshd too (`qemu+ssh://`, the ssh config passed by a wrapper
named in the URI's `command=`), so every byte between the hosts — libvirt's RPC, a migration's
memory stream (`migrate_uris`: the addresses of the veth), the files copied by rsync/scp —
crosses the veth. Nothing else is shared but the rest of the filesystem (the OS image, the
guest's kernel: what `vjob image distribute` would give). Every process started here, and any
QEMU its libvirtd started, is stopped by pid; the namespace, and with it the veth pair, removed.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devkit.devcluster_daemons import cmdline, run_checked, wait_until
from devkit.devcluster_hosts import (
    TMPFS_DIRS,
    Host,
    _ip_quiet,
    _listens,
    _netns_pids,
    _prepare_libvirt,
    start_libvirtd,
)
from vjob import proc
from vjob.errors import VjobError

HOST = Host("hostw", "198.18.251.2", ())
"""Network namespace `vjob-hostw`, this machine's end of its veth `vjh-w`."""
PEER_ADDRESS = "198.18.251.1"
"""This machine's address on the veth: how the second host reaches the first."""
SSH_HOST = "vjob-hostw"
"""Its ssh name (not the shared-stack host's `vjob-hostb`: both may be up in one run)."""
LOCK = "/tmp/vjob-wire-host.lock"
HOST_UUID = "6a0b1c2d-0000-4000-8000-0000000000f7"
"""Apart from the dev cluster's hosts' and the second libvirtd's: libvirt refuses a migration
between two daemons with one host_uuid."""


_IN_NETNS = ("nsenter", f"--net=/run/netns/{HOST.netns}", "--")


class WireHost:
    """Bring the host up (`up`) and down (`down`); `work` holds its configuration and logs."""

    def __init__(self, work: Path, root: Path) -> None:
        self.work = work
        self.root = root
        self.holder: subprocess.Popen[bytes] | None = None
        self.pids: dict[str, int] = {}
        self.netns_made = False

    @property
    def ssh_config(self) -> Path:
        return self.work / "ssh_config"

    @property
    def uri(self) -> str:
        """libvirt over ssh to the host's sshd: the wrapper gives ssh the run's config."""
        return f"qemu+ssh://{SSH_HOST}/system?command={self.work / 'ssh'}&no_tty=1"

    def enter(self) -> list[str]:
        if self.holder is None:
            raise VjobError("the second host is not up")
        return ["nsenter", "-t", str(self.holder.pid), "-m", "-u", "-n", "--"]

    # -- up --------------------------------------------------------------------------------------
    def up(self) -> None:
        self._network()
        self.holder = subprocess.Popen(
            [*_IN_NETNS, "unshare", "--mount", "--uts", "--propagation", "private", "--", "sleep", "infinity"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        own = f"/proc/{self.holder.pid}/ns/mnt"
        wait_until(lambda: os.readlink(own) != os.readlink("/proc/self/ns/mnt"), 10, "the second host's namespaces")
        self._mounts()
        self._libvirtd()
        self._sshd()
        if not _virsh_ok_uri(self.uri):
            raise VjobError(f"libvirt over ssh to the second host does not answer: {self.uri}")

    def _network(self) -> None:
        if HOST.netns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout:
            if _netns_pids(HOST.netns):  # another run's host is up: never take it over
                raise VjobError(f"network namespace {HOST.netns} is in use (ip netns pids {HOST.netns})")
            _ip_quiet(["ip", "netns", "del", HOST.netns])  # an interrupted run's, empty
        run_checked(["ip", "netns", "add", HOST.netns])
        self.netns_made = True
        run_checked(["ip", "link", "add", HOST.veth, "type", "veth", "peer", "name", "eth0", "netns", HOST.netns])
        run_checked(["ip", "addr", "add", f"{PEER_ADDRESS}/24", "dev", HOST.veth])
        run_checked(["ip", "link", "set", HOST.veth, "up"])
        inside = ["ip", "netns", "exec", HOST.netns]
        run_checked([*inside, "ip", "addr", "add", f"{HOST.address}/24", "dev", "eth0"])
        run_checked([*inside, "ip", "link", "set", "eth0", "up"])
        run_checked([*inside, "ip", "link", "set", "lo", "up"])

    def _mounts(self) -> None:
        enter = self.enter()
        run_checked([*enter, "hostname", "hostb"])
        # the host's own sysfs (its network devices), the machine's cgroup tree kept on it
        aside = self.work / "cgroup"
        aside.mkdir(exist_ok=True)
        run_checked([*enter, "mount", "--rbind", "/sys/fs/cgroup", str(aside)])
        run_checked([*enter, "mount", "-t", "sysfs", "vjob-hostw", "/sys"])
        run_checked([*enter, "mount", "--move", str(aside), "/sys/fs/cgroup"])
        for path in TMPFS_DIRS:
            Path(path).mkdir(parents=True, exist_ok=True)
            run_checked([*enter, "mount", "-t", "tmpfs", "-o", "mode=0755,size=256m", "vjob-hostw", path])
        varlib, etc = self.work / "var-lib-libvirt", self.work / "etc-libvirt"
        _prepare_libvirt(varlib, etc, HOST_UUID)
        run_checked([*enter, "mount", "--bind", str(varlib), "/var/lib/libvirt"])
        run_checked([*enter, "mount", "--bind", str(etc), "/etc/libvirt"])
        run_checked([*enter, "mount", "-t", "tmpfs", "-o", "mode=0755,size=2g", "vjob-hostw", str(self.root)])

    def _libvirtd(self) -> None:
        assert self.holder is not None
        root = Path(f"/proc/{self.holder.pid}/root")
        self.pids.update(start_libvirtd(self.enter(), root, self.work / "libvirtd.log", "the second host"))

    def _sshd(self) -> None:
        w = self.work
        for key in ("host_key", "client_key"):
            run_checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(w / key)])
        (w / "authorized_keys").write_text((w / "client_key.pub").read_text())
        (w / "sshd_config").write_text(
            f"Port 22\nListenAddress {HOST.address}\nHostKey {w / 'host_key'}\nPidFile /run/vjob/sshd.pid\n"
            f"AuthorizedKeysFile {w / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "MaxStartups 100\nMaxSessions 100\nSubsystem sftp internal-sftp\n"
        )
        self.ssh_config.write_text(
            f"Host {SSH_HOST}\n  HostName {HOST.address}\n  Port 22\n  User root\n  IdentityFile {w / 'client_key'}\n"
            "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
            "  BatchMode yes\n"
        )
        wrapper = w / "ssh"  # libvirt's `command=`: its ssh with the run's config, nothing of root's
        wrapper.write_text(f'#!/bin/sh\nexec ssh -F {self.ssh_config} "$@"\n')
        wrapper.chmod(0o755)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        with (w / "sshd.log").open("ab") as out:
            sshd = subprocess.Popen(
                [*self.enter(), "/usr/sbin/sshd", "-D", "-e", "-f", str(w / "sshd_config")],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pids["sshd"] = sshd.pid
        wait_until(lambda: _listens(HOST.address, 22) or sshd.poll() is not None, 20, "the second host's sshd")
        if sshd.poll() is not None:
            raise VjobError(f"the second host's sshd exited ({sshd.returncode}); see {w}/sshd.log")

    # -- down ------------------------------------------------------------------------------------
    def down(self) -> None:
        """Ours by pid (libvirtd first: it starts nothing more), then whatever still runs in the
        namespace (QEMUs our libvirtd started, an ssh session's helper), the holder, the netns."""
        for name in ("libvirtd", "sshd", "virtlogd"):
            pid = self.pids.pop(name, 0)
            if pid and proc.alive(pid):
                proc.stop_pid(pid, grace_s=15.0)
        if self.netns_made:
            holder = self.holder.pid if self.holder is not None else 0
            for pid in _netns_pids(HOST.netns):
                if pid != holder and proc.alive(pid) and cmdline(pid):
                    proc.stop_pid(pid, grace_s=10.0)
        if self.holder is not None:
            proc.stop_pid(self.holder.pid, grace_s=5.0)
            self.holder = None
        if self.netns_made:
            _ip_quiet(["ip", "netns", "del", HOST.netns])  # its eth0 goes, and with it vjh-w
            self.netns_made = False


def _virsh_ok_uri(uri: str) -> bool:
    done = subprocess.run(["virsh", "-c", uri, "uri"], capture_output=True, timeout=60, check=False)
    return done.returncode == 0


@contextmanager
def brought_up(work: Path, root: Path) -> Iterator[WireHost]:
    """The host up for the `with` body, down after it (also after a failed `up`).

    One such host on the machine at a time (its names and addresses are fixed): a second test
    run waits on LOCK until the first one's host is down, rather than fail."""
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        host = WireHost(work, root)
        try:
            host.up()
            yield host
        finally:
            host.down()
