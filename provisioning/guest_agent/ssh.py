"""ssh between a multi-node job's VMs, kept inside the guest: the user's home is never written.

Why not the user's ~/.ssh: the home in the guest is the site's /home over NFS ([guest] mounts),
the same directory the user logs in with on the site's machines. The job's key pair written
there would replace the user's own `authorized_keys` and `id_ed25519` — on every machine that
mounts that home, for as long as the files stay. So the job's key lives in the guest's own
/etc (the image's overlay, gone with the job):

* `/etc/vjob/ssh/<uid>.pub` — root's, read by sshd (`AuthorizedKeysFile`, `%U` the target
  user's numeric uid; the user's own `~/.ssh/authorized_keys` is still honoured after it),
* `/etc/vjob/ssh/<uid>.key` — the job's private key, the user's, mode 0600,
* `/etc/ssh/ssh_config.d/vjob.conf` — for the job's host names only: that key
  (`IdentityFile …/%i.key`, `%i` the local uid) and no host-key checking (host keys are made
  at each VM's boot, on a network only the job is on).

Files are named by uid, not user name: the guest may know the job's uid under another name
(agent.ensure_user's `vjob-u<uid>`), and both sides of ssh expand a uid token.

Standard library only (it runs with the guest's python3); the guest agent calls `start`.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")
KEY_DIR = "vjob/ssh"
"""Under the guest's /etc: the job's key pair, root's directory."""


class SshError(Exception):
    """The guest's ssh set-up cannot be made safely; the message names the path."""


def key_dir(etc: Path) -> Path:
    """/etc/vjob/ssh, root's and 0755; refused when any part of it is a symbolic link or not a
    directory (the image's /etc is root's, but nothing is followed on trust)."""
    d = etc / KEY_DIR
    for part in (d.parent, d):
        part.mkdir(mode=0o755, exist_ok=True)
        st = os.lstat(part)
        if not stat.S_ISDIR(st.st_mode):
            raise SshError(f"{part}: not a directory (a symbolic link?)")
        os.chown(part, 0, 0, follow_symlinks=False)
        os.chmod(part, 0o755)  # a directory, checked just above; /etc is the guest root's alone
    return d


def write_file(path: Path, text: str, mode: int, uid: int, gid: int) -> None:
    """Write `path` with this owner and mode, never through a link planted at its name."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, text.encode())
        os.fchmod(fd, mode)
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def client_config(hosts: list[str], keys: Path) -> str:
    """ssh's settings for the job's host names (ssh_config.d/vjob.conf)."""
    return (
        f"Host {' '.join(hosts)}\n"
        f"  IdentityFile {keys}/%i.key\n"
        "  StrictHostKeyChecking no\n"
        "  UserKnownHostsFile /dev/null\n"
        "  LogLevel ERROR\n"
    )


def sshd_argv(host_key: Path, keys: Path) -> list[str]:
    """sshd with this boot's host key, no password, no PAM, the job's public key first."""
    return [
        str(SSHD),
        "-o",
        "UsePAM=no",
        "-o",
        f"HostKey={host_key}",
        "-o",
        "PasswordAuthentication=no",
        "-o",
        f"AuthorizedKeysFile={keys}/%U.pub .ssh/authorized_keys",
    ]


def install(uid: int, gid: int, hosts: list[str], private: str, public: str, etc: Path = Path("/etc")) -> Path:
    """The job's key pair for `uid` under /etc/vjob/ssh and the client settings; the key directory."""
    keys = key_dir(etc)
    write_file(keys / f"{uid}.pub", public.rstrip("\n") + "\n", 0o644, 0, 0)
    write_file(keys / f"{uid}.key", private, 0o600, uid, gid)
    conf = etc / "ssh" / "ssh_config.d" / "vjob.conf"
    conf.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    write_file(conf, client_config(hosts, keys), 0o644, 0, 0)
    return keys


def start(uid: int, gid: int, hosts: list[str], private: str, public: str, etc: Path = Path("/etc")) -> bool:
    """sshd with a host key of this boot and the job's key for `uid`: no password between the
    job's VMs. False when there is no key or the image has no sshd."""
    if not private or not SSHD.exists():
        return False
    keys = install(uid, gid, hosts, private, public, etc)
    host_key = etc / "ssh" / "ssh_host_ed25519_key"
    if not host_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    subprocess.run(sshd_argv(host_key, keys), check=True, stdin=subprocess.DEVNULL)
    return True
