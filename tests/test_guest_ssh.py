"""The job's ssh between its VMs lives in the guest's /etc, never in the user's home
(provisioning.guest_agent.ssh, docs/multinode.md).

Why a real sshd and a real ssh here: the files are named by uid and found through sshd's `%U`
and ssh's `%i`, and sshd's StrictModes judges every directory above them; only the real
programs say whether a login works with them. sshd runs on 127.0.0.1 (a free port) with the
argv the guest agent uses, in a mount namespace of its own where the test user's password
field reads `*` as in a guest (the host's `useradd` left `!`, which sshd without PAM reads as a
locked account); ssh runs as that user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioning import network
from provisioning.guest_agent import ssh
from tests.services import free_port, port_open, wait_for
from tests.test_realjob_slurm import USER, _user


@pytest.fixture
def etc() -> Iterator[Path]:
    """A guest's /etc stand-in under a root-owned 0755 directory (sshd's StrictModes walks up
    to /: a world-writable /tmp above it would fail the login for the wrong reason)."""
    base = Path(tempfile.mkdtemp(prefix="vjob-guest-ssh-", dir="/var/lib"))
    base.chmod(0o755)
    try:
        (base / "etc").mkdir(mode=0o755)
        yield base / "etc"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_job_key_is_written_under_etc_by_uid_and_never_through_a_link(etc: Path, tmp_path: Path) -> None:
    private, public = network.job_ssh_key("vjob-test")
    keys = ssh.install(1000, 1001, ["vm0", "vm1"], private, public, etc)
    assert keys == etc / "vjob" / "ssh"
    pub, key = (keys / "1000.pub").stat(), (keys / "1000.key").stat()
    assert (pub.st_uid, pub.st_gid, pub.st_mode & 0o777) == (0, 0, 0o644)
    assert (key.st_uid, key.st_gid, key.st_mode & 0o777) == (1000, 1001, 0o600)
    assert (keys / "1000.key").read_text() == private
    assert (keys / "1000.pub").read_text() == public + "\n"
    conf = (etc / "ssh" / "ssh_config.d" / "vjob.conf").read_text()
    assert conf.startswith("Host vm0 vm1\n") and f"IdentityFile {keys}/%i.key\n" in conf
    assert f"AuthorizedKeysFile={keys}/%U.pub .ssh/authorized_keys" in ssh.sshd_argv(etc / "hk", keys)
    # A link planted at the key's name is not followed: its target keeps its bytes.
    target = tmp_path / "shadow"
    target.write_text("root:x\n")
    (keys / "2000.key").symlink_to(target)
    with pytest.raises(OSError):
        ssh.install(2000, 2000, ["vm0"], private, public, etc)
    assert target.read_text() == "root:x\n"
    # A key directory that is a link is refused, nothing written through it.
    other = tmp_path / "etc2"
    (other / "vjob").mkdir(parents=True)
    (other / "vjob" / "ssh").symlink_to(tmp_path)
    with pytest.raises(ssh.SshError, match="not a directory"):
        ssh.install(1000, 1000, ["vm0"], private, public, other)
    assert not (tmp_path / "1000.key").exists()


@pytest.mark.skipif(os.geteuid() != 0 or not ssh.SSHD.exists(), reason="needs root and sshd")
def test_a_real_sshd_lets_the_user_in_with_the_job_key_and_nothing_in_the_home(etc: Path) -> None:
    user = _user()
    home_ssh = Path(user.pw_dir) / ".ssh"
    before = sorted(p.name for p in home_ssh.iterdir()) if home_ssh.is_dir() else None
    private, public = network.job_ssh_key("vjob-test")
    keys = ssh.install(user.pw_uid, user.pw_gid, ["vm0"], private, public, etc)
    host_key = etc / "ssh" / "host_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True, timeout=30)
    shadow = etc / "shadow"  # the user's entry as a guest's: not locked
    lines = Path("/etc/shadow").read_text().splitlines()
    shadow.write_text(
        "".join(f"{USER}:*:{ln.split(':', 2)[2]}\n" if ln.startswith(f"{USER}:") else ln + "\n" for ln in lines)
    )
    shadow.chmod(0o640)
    port = free_port()
    sshd = [*ssh.sshd_argv(host_key, keys), "-D", "-e", "-f", "/dev/null", "-p", str(port)]
    sshd += ["-o", "ListenAddress=127.0.0.1", "-o", "PidFile=none"]
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    server = subprocess.Popen(
        ["unshare", "--mount", "sh", "-c", f'mount --bind {shadow} /etc/shadow && exec "$@"', "sshd", *sshd],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: port_open(port) or server.poll() is not None, 30, "sshd listening")
        assert server.poll() is None, server.communicate()[0]
        client = etc / "client.conf"  # the test's own name for vm0, then the guest's settings
        client.write_text(
            f"Host vm0\n  HostName 127.0.0.1\n  Port {port}\n  BatchMode yes\n"
            + (etc / "ssh" / "ssh_config.d" / "vjob.conf").read_text()
        )
        client.chmod(0o644)
        res = subprocess.run(
            ["runuser", "-u", USER, "--", "ssh", "-F", str(client), "vm0", "id -u"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert res.returncode == 0 and res.stdout.strip() == str(user.pw_uid), (res.stdout, res.stderr)
        # Without the job's key the same login is refused: the key is what let the user in.
        (keys / f"{user.pw_uid}.pub").write_text(network.job_ssh_key("other")[1] + "\n")
        refused = subprocess.run(
            ["runuser", "-u", USER, "--", "ssh", "-F", str(client), "vm0", "id -u"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused.stderr
    finally:
        server.terminate()
        server.wait(timeout=30)
    after = sorted(p.name for p in home_ssh.iterdir()) if home_ssh.is_dir() else None
    assert after == before, (before, after)
