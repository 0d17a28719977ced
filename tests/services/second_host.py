"""A second host for the tests: the second libvirtd's namespace with its own files and an sshd.

Why: a resume on another node must work without a shared filesystem, and the driver must
check the copy that arrived, not the source seen through a local path. The second libvirtd
(tests/services/libvirt.py) already runs in its own mount namespace; here a tmpfs is mounted
over one directory inside that namespace only, so the second host's VM and snapshot
directories have the same path as the first host's but other contents, invisible from the
first. An sshd started in the same namespace (127.0.0.1, a free port, a key made for the run)
is how the driver reaches it, exactly as it reaches a real node: rsync over ssh, sha256sum
over ssh. Everything started here is stopped by pid, and the tmpfs unmounted, at the end.

That host shares this machine's network stack: what is sent to it goes over loopback.
`second_host_over_wire` (below; tests/services/wire_host.py) is a host with a network
namespace, libvirtd and QEMUs of its own, reached over a veth only: Saline's relocation tests
use it. Both give a `SecondHost`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.services import wire_host
from tests.services.libvirt import SECOND_NODE_DIR
from vjob import proc
from vjob.config import ProvisioningConfig

SSH_HOST = "vjob-hostb"
"""The ssh name of the second host in the run's ssh config."""


@dataclass(frozen=True)
class SecondHost:
    """How to reach the second host and where its private files live."""

    uri: str
    ssh_host: str
    ssh_config: Path
    root: Path
    """Same path on both hosts; on the second one a tmpfs the first never sees."""
    address: str = "127.0.0.1"
    """The second host's address (its sshd's, its migrations')."""
    first_address: str = "127.0.0.1"
    """This machine's address as the second host reaches it."""
    veth: str = ""
    """This machine's end of the link to the host ("" when they share the network stack)."""

    def wire_bytes(self) -> tuple[int, int]:
        """Bytes (sent to the host, received from it) over the veth since it was made: what
        crossed the wire, counted by the kernel."""
        if not self.veth:
            raise AssertionError("this second host shares the network stack: no wire to count")
        stats = Path("/sys/class/net") / self.veth / "statistics"
        return int((stats / "tx_bytes").read_text()), int((stats / "rx_bytes").read_text())

    def migrate_uris(self, first: str, second: str) -> dict[str, str]:
        """`provisioning.migrate_uris` for nodes `first` (this machine) and `second` (the host):
        where each destination's QEMU takes a migration's memory stream."""
        return {first: f"tcp://{self.first_address}", second: f"tcp://{self.address}"}

    def run(self, *argv: str, timeout_s: float = 60.0) -> str:
        """A command on the second host (as the driver runs them: ssh with our config)."""
        return proc.run(["ssh", "-F", str(self.ssh_config), self.ssh_host, "--", *argv], timeout_s=timeout_s)

    def read_bytes(self, path: Path) -> bytes:
        res = subprocess.run(
            ["ssh", "-F", str(self.ssh_config), self.ssh_host, "--", "cat", str(path)],
            capture_output=True,
            timeout=60,
            check=False,
        )
        return res.stdout if res.returncode == 0 else b""

    def provisioning(self, first_uri: str, **extra: Any) -> ProvisioningConfig:
        """Two nodes sharing no VM or snapshot directory: "a" this host (`first_uri`), "b" the
        second one, reached by ssh and rsync; the same paths on both, other contents."""
        return ProvisioningConfig(
            nodes={"a": first_uri, "b": self.uri},
            hosts={"a": "", "b": self.ssh_host},
            copy_method="rsync",
            vm_dir=str(self.root / "vms"),
            snapshot_dir=str(self.root / "snapshots"),
            **extra,
        )

    def exists(self, path: Path) -> bool:
        res = subprocess.run(
            ["ssh", "-F", str(self.ssh_config), self.ssh_host, "--", "test", "-e", str(path)],
            capture_output=True,
            timeout=60,
            check=False,
        )
        return res.returncode == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ns(pid: int, *argv: str) -> list[str]:
    return ["nsenter", "-t", str(pid), "-m", "-u", "--", *argv]


def _libvirtd_pid() -> int:
    text = (SECOND_NODE_DIR / "run" / "libvirtd.pid").read_text().strip()
    return int(text)


def _wait_port(port: int, timeout_s: float, sshd: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sshd.poll() is not None:
            raise RuntimeError(f"sshd of the second host exited with status {sshd.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"sshd of the second host did not listen on port {port} within {timeout_s:.0f} s")


@pytest.fixture(scope="session")
def second_host(libvirt_second_node: str) -> Iterator[SecondHost]:
    """The second libvirtd as a host of its own: private root, reached over ssh."""
    work = Path(tempfile.mkdtemp(prefix="vjob-hostb-", dir="/var/tmp"))
    work.chmod(0o700)
    root = Path(tempfile.mkdtemp(prefix="vjob-hosts-", dir="/var/tmp"))
    root.chmod(0o755)  # QEMU (libvirt-qemu) traverses it on both hosts
    pid = _libvirtd_pid()
    subprocess.run(
        _ns(pid, "mount", "-t", "tmpfs", "-o", "mode=0755,size=2g", "vjob-hostb", str(root)), check=True, timeout=30
    )
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / key)], check=True, timeout=30)
    (work / "authorized_keys").write_text((work / "client_key.pub").read_text())
    port = _free_port()
    (work / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {work / 'host_key'}\nPidFile {work / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {work / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "MaxStartups 100\nMaxSessions 100\n"
        # scp speaks SFTP since OpenSSH 9 (a node's sshd has this line from Debian's own config)
        "Subsystem sftp internal-sftp\n"
    )
    (work / "ssh_config").write_text(
        f"Host {SSH_HOST}\n  HostName 127.0.0.1\n  Port {port}\n  User root\n  IdentityFile {work / 'client_key'}\n"
        "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
        "  BatchMode yes\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    log = open(work / "sshd.log", "wb")  # the daemon writes to it for its whole life
    sshd = subprocess.Popen(
        _ns(pid, "/usr/sbin/sshd", "-D", "-e", "-f", str(work / "sshd_config")),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    previous = os.environ.get("VJOB_SSH_CONFIG")
    os.environ["VJOB_SSH_CONFIG"] = str(work / "ssh_config")
    try:
        _wait_port(port, 20, sshd)
        yield SecondHost(libvirt_second_node, SSH_HOST, work / "ssh_config", root)
    finally:
        if previous is None:
            os.environ.pop("VJOB_SSH_CONFIG", None)
        else:
            os.environ["VJOB_SSH_CONFIG"] = previous
        proc.stop_pid(sshd.pid, grace_s=10)
        sshd.wait(timeout=10)
        log.close()
        subprocess.run(_ns(pid, "umount", "-l", str(root)), check=False, timeout=30)
        subprocess.run(["rm", "-rf", "--", str(root), str(work)], check=False, timeout=60)


@pytest.fixture(scope="module")
def second_host_over_wire() -> Iterator[SecondHost]:
    """A second host with a network stack of its own (tests/services/wire_host.py): its
    libvirtd, sshd and QEMUs in their own network namespace, reached over a veth only.

    Module-scoped: `VJOB_SSH_CONFIG` names this host's ssh config only while a module using it
    runs, so the session's `second_host` (also reached by that variable) is unaffected."""
    work = Path(tempfile.mkdtemp(prefix="vjob-hostw-", dir="/var/tmp"))
    work.chmod(0o755)  # the host's libvirt directories are in it; QEMU traverses them
    root = Path(tempfile.mkdtemp(prefix="vjob-hostw-files-", dir="/var/tmp"))
    root.chmod(0o755)  # QEMU (libvirt-qemu) traverses it on both hosts
    previous = os.environ.get("VJOB_SSH_CONFIG")
    try:
        with wire_host.brought_up(work, root) as host:
            os.environ["VJOB_SSH_CONFIG"] = str(host.ssh_config)
            yield SecondHost(
                host.uri,
                wire_host.SSH_HOST,
                host.ssh_config,
                root,
                wire_host.HOST.address,
                wire_host.PEER_ADDRESS,
                wire_host.HOST.veth,
            )
    finally:
        if previous is None:
            os.environ.pop("VJOB_SSH_CONFIG", None)
        else:
            os.environ["VJOB_SSH_CONFIG"] = previous
        subprocess.run(["rm", "-rf", "--", str(root), str(work)], check=False, timeout=60)
