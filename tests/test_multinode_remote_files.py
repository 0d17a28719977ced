"""Files on another host over ssh (provisioning.transfer): quoting, hashing there, limits, dirs.

Uses the second host of tests/services/second_host.py (its own tmpfs, reached by ssh); no
guest is booted, so this runs in a few seconds once the second libvirtd is up.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioning import integrity, transfer
from provisioning.transfer import Endpoint
from provisioning.vm_types import SnapshotError
from tests.services.second_host import SecondHost, second_host  # noqa: F401 - fixture
from vjob.errors import VjobError

pytestmark = pytest.mark.libvirt


@pytest.fixture(autouse=True, scope="module")
def _close_shared_connections() -> Iterator[None]:
    """The masters these tests start end with them, not ControlPersist seconds later."""
    yield
    transfer.close_connections()


@pytest.fixture
def remote_dir(second_host: SecondHost) -> Path:  # noqa: F811 - the fixture imported above
    d = second_host.root / "files"
    transfer.ensure_remote_dir(Endpoint(d, second_host.ssh_host), 0o700)
    return d


def test_a_path_with_shell_characters_stays_one_argument(second_host: SecondHost, remote_dir: Path) -> None:  # noqa: F811
    """ssh hands the remote shell one string: unquoted, `; touch …` would run as a command."""
    marker = Path("/root/vjob-pwned-by-a-path")  # where ssh's remote shell starts (root's home)
    hostile = remote_dir / f"a b; touch {marker.name}"
    transfer.write_text(Endpoint(hostile, second_host.ssh_host), "data")
    assert second_host.run("cat", f"'{hostile}'") == "data"
    assert not second_host.exists(marker)
    assert transfer.exists(Endpoint(hostile, second_host.ssh_host))


def test_size_and_hash_are_computed_on_the_host_holding_the_file(
    second_host: SecondHost,  # noqa: F811
    remote_dir: Path,
) -> None:
    path = remote_dir / "x.state"
    transfer.write_text(Endpoint(path, second_host.ssh_host), "hello")
    assert not path.exists()  # not on this host: the answers below come from the other one
    ep = Endpoint(path, second_host.ssh_host)
    assert transfer.size(ep) == 5
    assert transfer.sha256(ep) == hashlib.sha256(b"hello").hexdigest()
    assert transfer.size(Endpoint(remote_dir / "absent", second_host.ssh_host)) is None
    integrity.check_against(
        "vm", "b", path, {"size_bytes": 5, "sha256": hashlib.sha256(b"hello").hexdigest()}, second_host.ssh_host
    )
    with pytest.raises(SnapshotError, match="is corrupt"):
        integrity.check_against("vm", "b", path, {"size_bytes": 5, "sha256": "0" * 64}, second_host.ssh_host)


def test_an_oversized_manifest_reads_as_unreadable(second_host: SecondHost, remote_dir: Path) -> None:  # noqa: F811
    state = remote_dir / "big.state"
    transfer.write_text(
        Endpoint(integrity.manifest_path(state), second_host.ssh_host), " " * (transfer.MANIFEST_LIMIT + 1)
    )
    assert integrity.read_manifest(state, second_host.ssh_host) == integrity.UNREADABLE
    integrity.write_manifest(state, {"sha256": "ab"}, second_host.ssh_host)
    assert integrity.read_manifest(state, second_host.ssh_host) == {"sha256": "ab"}
    mode = second_host.run("stat", "-c", "%a", str(integrity.manifest_path(state))).strip()
    assert mode == "600"


def test_a_remote_directory_others_can_write_is_refused(second_host: SecondHost, remote_dir: Path) -> None:  # noqa: F811
    d = remote_dir / "open"
    second_host.run("mkdir", "-p", str(d))
    second_host.run("chown", "nobody", str(d))  # another user's directory
    with pytest.raises(VjobError, match="owned by uid 0"):
        transfer.ensure_remote_dir(Endpoint(d, second_host.ssh_host), 0o700)


def test_a_remote_directory_writable_by_others_is_refused_not_repaired(
    second_host: SecondHost,  # noqa: F811
    remote_dir: Path,
) -> None:
    d = remote_dir / "world"
    second_host.run("mkdir", "-p", "-m", "777", str(d))
    second_host.run("chmod", "777", str(d))
    with pytest.raises(VjobError, match="writable by nobody else"):
        transfer.ensure_remote_dir(Endpoint(d, second_host.ssh_host), 0o700)
    assert second_host.run("stat", "-c", "%a", str(d)).strip() == "777"


def _client_port(host: str) -> str:
    """The source port of the TCP connection this call came over, as sshd saw it."""
    return transfer.run_on(host, ["sh", "-c", 'echo "$SSH_CONNECTION"']).split()[1]


def _master_pid(host: str) -> int | None:
    """The pid of the master sharing connections to `host` (`ssh -O check`), None when none."""
    argv = ["ssh", "-o", "BatchMode=yes", *transfer._ssh_options(), *transfer._control_options(), "-O", "check", host]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    found = re.search(r"Master running \(pid=([0-9]+)\)", res.stderr)
    return int(found.group(1)) if res.returncode == 0 and found else None


def test_remote_calls_share_one_connection_a_dead_master_falls_back_and_close_stops_it(
    second_host: SecondHost,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = second_host.ssh_host
    monkeypatch.setattr(transfer, "SHARE_CONNECTIONS", True)
    transfer.close_connections()
    ports = {_client_port(host) for _ in range(3)}
    assert len(ports) == 1, ports  # three calls, one TCP connection (one key exchange)
    master = _master_pid(host)
    assert master is not None
    os.kill(master, signal.SIGKILL)  # started by this test (the first call above); its socket stays behind
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{master}").exists():
        time.sleep(0.05)
    after = _client_port(host)  # nobody answers on the socket: ssh removes it, connects, becomes the master
    assert after not in ports
    assert _client_port(host) == after and _master_pid(host) not in (None, master)  # shared again
    assert transfer.close_connections() >= 1
    assert _master_pid(host) is None  # stopped: the next call starts afresh
    monkeypatch.setattr(transfer, "SHARE_CONNECTIONS", False)
    assert len({_client_port(host) for _ in range(2)}) == 2  # sharing off: a connection per call
