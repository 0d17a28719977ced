#!/usr/bin/python3 -I
"""The vjob guest agent: runs one batch job inside its VM, as its user, and records its exit.

Why this shape: a vjob guest boots for one job. The host (the pilot, provisioning.job_disk)
hands over the job on a small ext4 disk, the job disk (/dev/vdb): the job's working directory
under `/work` and its description under `/.vjob` (job.json: argv, environment, uid/gid, user
name, home, working directory, host name; `script`: the user's script). That disk is part of
the VM, so it travels with every checkpoint: a job resumed on another node still has its
files. The agent

* creates the job's user and group in the guest with the host's uid/gid (files the job writes
  then belong to the user when the pilot copies them back),
* shows the working directory at the job's own path (a bind mount of `/work`), so absolute
  paths in the script keep working,
* runs the script with the job's argv and environment as that user, stdin from /dev/null,
  stdout on the second serial port and stderr on the third (raw mode: bytes as written), which
  the host logs to files the pilot copies into the job's output,
* writes the exit status to `/.vjob/exit` on the job disk (128+N for a signal, like a shell),
  syncs and unmounts it; vjob-init then powers the guest off.

A multi-node job (docs/multinode.md) has one VM per node; job.json's `network` gives this VM its
address on the job's private network, every VM's host name (/etc/hosts), the host file at
$VJOB_NODEFILE, and the job's ssh key (in the guest's own /etc, never the user's home: the
module ssh): sshd runs and the user reaches every VM without a password. Only the first VM
(`leader`) runs the script; the others wait, reachable, until the pilot ends the job. A Saline
VM with a NAT interface (`network.nat`, provisioning.nat) gets that NIC's static address, the
default route through its gateway and resolv.conf.

Everything in job.json came from the host but was written into a disk the user could have
prepared: it is checked here too (types, sizes, names), and the job never runs as root unless
its uid is 0 (a root job on the host).

Standard library only: it runs with the guest's python3, and nothing of vjob is installed there.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import socket
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass
from pathlib import Path

if __package__:  # imported on the host (tests, provisioning.job_disk): this package's modules
    from . import mounts, site_net
    from . import ssh as job_ssh
else:  # the guest: provisioning.image_build installs the helper modules under /usr/lib/vjob-guest
    sys.path.insert(0, "/usr/lib/vjob-guest")
    import mounts
    import site_net
    import ssh as job_ssh

JOB_DEVICE = "/dev/vdb"
MOUNT = Path("/vjob")
CONTROL = ".vjob"
WORK = "work"
STDOUT_TTY = "/dev/ttyS1"
STDERR_TTY = "/dev/ttyS2"
MAX_JOB_JSON = 4 << 20
USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,62}")
NODEFILE = Path("/etc/vjob/nodefile")
MAC_RE = re.compile(r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}")
PEER_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
MAX_PEERS = 254
PEER_WAIT_S = 600.0
SSH_KEY_RE = re.compile(r"ssh-ed25519 [A-Za-z0-9+/=]{40,200}")
PRIVATE_KEY_RE = re.compile(
    r"-----BEGIN OPENSSH PRIVATE KEY-----\n[A-Za-z0-9+/=\n]{100,2000}-----END OPENSSH PRIVATE KEY-----\n"
)
FORBIDDEN_CWD = ("/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/boot", "/vjob", "/run")
"""A working directory is bind-mounted at its host path: never over what the guest runs on."""


class JobError(Exception):
    """The job description is unusable; the message names the field."""


@dataclass(frozen=True)
class Job:
    argv: list[str]
    env: dict[str, str]
    uid: int
    gid: int
    user: str
    home: str
    cwd: str
    hostname: str
    network: Network | None = None


@dataclass(frozen=True)
class Nat:
    """This VM's way out (job.json `network.nat`): the same address and gateway on every node."""

    mac: str
    ip: str
    prefix: int
    gateway: str
    dns: list[str]


@dataclass(frozen=True)
class Network:
    """This VM's place on the job's private network (job.json `network`)."""

    mac: str
    ip: str
    prefix: int
    peers: list[tuple[str, str]]
    """(ip, host name) of every VM of the job, the first VM first."""
    leader: bool
    ssh_private: str = ""
    ssh_public: str = ""
    nat: Nat | None = None
    bridged: site_net.Bridged | None = None
    """A second NIC on the operator's bridge, configured by the site's DHCP (site_net)."""


def parse_nat(data: object, private_mac: str) -> Nat:
    """job.json's `network.nat`, every field checked (it reaches the routing table and
    resolv.conf): the gateway inside the NIC's own network, not the NIC's address."""
    if not isinstance(data, dict):
        raise JobError("network.nat: must be an object")
    mac = data.get("mac")
    if not isinstance(mac, str) or not MAC_RE.fullmatch(mac) or mac == private_mac:
        raise JobError(f"network.nat.mac: {str(mac)[:40]!r}: must match {MAC_RE.pattern}, not network.mac")
    prefix = data.get("prefix")
    if not isinstance(prefix, int) or isinstance(prefix, bool) or not 8 <= prefix <= 30:
        raise JobError(f"network.nat.prefix: {str(prefix)[:40]!r}: must be an integer in 8..30")
    ip = _ipv4("network.nat.ip", data.get("ip"))
    gateway = _ipv4("network.nat.gateway", data.get("gateway"))
    own = ipaddress.IPv4Network(f"{ip}/{prefix}", strict=False)
    if ipaddress.IPv4Address(gateway) not in own or gateway == ip:
        raise JobError(f"network.nat.gateway: {gateway}: must be another address of {own}")
    dns = data.get("dns")
    if not isinstance(dns, list) or not 1 <= len(dns) <= 3:
        raise JobError("network.nat.dns: must be a list of 1..3 IPv4 addresses")
    return Nat(mac, ip, prefix, gateway, [_ipv4("network.nat.dns", d) for d in dns])


def parse_network(data: object) -> Network:
    """job.json's `network`, every field checked (it reaches /etc/hosts and ssh's files)."""
    if not isinstance(data, dict):
        raise JobError("network: must be an object")
    mac = data.get("mac")
    if not isinstance(mac, str) or not MAC_RE.fullmatch(mac):
        raise JobError(f"network.mac: {str(mac)[:40]!r}: must match {MAC_RE.pattern}")
    prefix = data.get("prefix")
    if not isinstance(prefix, int) or isinstance(prefix, bool) or not 8 <= prefix <= 30:
        raise JobError(f"network.prefix: {str(prefix)[:40]!r}: must be an integer in 8..30")
    raw_peers = data.get("peers")
    if not isinstance(raw_peers, list) or not 1 <= len(raw_peers) <= MAX_PEERS:
        raise JobError(f"network.peers: must be a list of 1..{MAX_PEERS} [ip, hostname] pairs")
    peers = []
    for item in raw_peers:
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)):
            raise JobError(f"network.peers: {str(item)[:80]!r}: must be an [ip, hostname] pair")
        peers.append((_ipv4("network.peers", item[0]), _peer_name(item[1])))
    ip = _ipv4("network.ip", data.get("ip"))
    if ip not in {p[0] for p in peers}:
        raise JobError(f"network.ip: {ip} is not one of network.peers")
    private, public = data.get("ssh_private", ""), data.get("ssh_public", "")
    if private or public:
        if not isinstance(private, str) or not PRIVATE_KEY_RE.fullmatch(private):
            raise JobError("network.ssh_private: must be one OpenSSH private key")
        if not isinstance(public, str) or not SSH_KEY_RE.fullmatch(public):
            raise JobError(f"network.ssh_public: {str(public)[:40]!r}: must match {SSH_KEY_RE.pattern}")
    leader = data.get("leader")
    if not isinstance(leader, bool):
        raise JobError("network.leader: must be true or false")
    nat = parse_nat(data["nat"], mac) if data.get("nat") is not None else None
    site, bridged = data.get("site"), None
    try:
        if nat is None and isinstance(site, dict) and "bridged" in site:  # the operator's bridge (site_net)
            bridged = site_net.parse_bridged(site, mac)
        elif nat is None and site is not None:  # the node service's gateway on this NIC (site_net)
            nat = Nat(**site_net.parse_site(site, mac, ip, prefix))  # type: ignore[arg-type]
    except site_net.SiteError as exc:
        raise JobError(str(exc)) from None
    return Network(mac, ip, prefix, peers, leader, private, public, nat, bridged)


def _ipv4(field: str, value: object) -> str:
    try:
        return str(ipaddress.IPv4Address(value if isinstance(value, str) else ""))
    except ValueError:
        raise JobError(f"{field}: {str(value)[:40]!r}: must be an IPv4 address") from None


def _peer_name(value: str) -> str:
    if not PEER_RE.fullmatch(value):
        raise JobError(f"network.peers: host name {value[:80]!r}: must match {PEER_RE.pattern}")
    return value


def check_path(field: str, value: object) -> str:
    """An absolute, normalised path without NUL or newline, up to 4096 bytes."""
    if not isinstance(value, str) or not value.startswith("/") or len(value.encode()) > 4096:
        raise JobError(f"{field}: {str(value)[:80]!r}: must be an absolute path")
    if "\0" in value or "\n" in value or os.path.normpath(value) != value or value.startswith("//"):
        raise JobError(f"{field}: {value[:80]!r}: must be a normalised path without NUL or newline")
    return value


def check_cwd(value: object) -> str:
    cwd = check_path("cwd", value)
    if cwd == "/" or any(cwd == p or cwd.startswith(p + "/") for p in FORBIDDEN_CWD):
        raise JobError(f"cwd: {cwd[:80]!r}: a job's working directory cannot be a system directory")
    return cwd


def parse_job(data: object) -> Job:
    """The job of a job.json document, every field checked."""
    if not isinstance(data, dict):
        raise JobError("job.json: must be an object")
    argv = data.get("argv")
    if not isinstance(argv, list) or not argv or len(argv) > 4096 or not all(isinstance(a, str) for a in argv):
        raise JobError("argv: must be a non-empty list of at most 4096 strings")
    if any("\0" in a for a in argv):
        raise JobError("argv: an argument holds a NUL byte")
    env = data.get("env")
    if not isinstance(env, dict) or len(env) > 4096:
        raise JobError("env: must be an object of at most 4096 variables")
    for key, value in env.items():
        if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,255}", key) or "\0" in value:
            raise JobError(f"env: {str(key)[:80]!r}: names are [A-Za-z_][A-Za-z0-9_]*, values strings without NUL")
    ids = {}
    for field in ("uid", "gid"):
        value = data.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
            raise JobError(f"{field}: {value!r}: must be an integer in 0..2^31-1")
        ids[field] = value
    user = data.get("user")
    if not isinstance(user, str) or not USER_RE.fullmatch(user):
        raise JobError(f"user: {str(user)[:80]!r}: must match {USER_RE.pattern}")
    hostname = data.get("hostname", "vjob")
    if not isinstance(hostname, str) or not HOST_RE.fullmatch(hostname):
        raise JobError(f"hostname: {str(hostname)[:80]!r}: must match {HOST_RE.pattern}")
    home, cwd = check_path("home", data.get("home")), check_cwd(data.get("cwd"))
    network = parse_network(data["network"]) if data.get("network") is not None else None
    return Job(list(argv), dict(env), ids["uid"], ids["gid"], user, home, cwd, hostname, network)


def ensure_user(job: Job, etc: Path = Path("/etc")) -> None:
    """The job's user and group exist in the guest with the host's uid and gid.

    An existing entry with that uid (gid) is kept whatever its name: ids are what files carry.
    A name already taken by another uid gets the job's uid under a `vjob-` prefixed name.
    """
    if job.uid == 0:
        return
    group_file, passwd_file = etc / "group", etc / "passwd"
    groups = [line.split(":") for line in group_file.read_text().splitlines() if line.count(":") >= 3]
    if not any(g[2] == str(job.gid) for g in groups):
        name = job.user if not any(g[0] == job.user for g in groups) else f"vjob-g{job.gid}"
        with group_file.open("a") as fh:
            fh.write(f"{name}:x:{job.gid}:\n")
    users = [line.split(":") for line in passwd_file.read_text().splitlines() if line.count(":") >= 6]
    if not any(u[2] == str(job.uid) for u in users):
        name = job.user if not any(u[0] == job.user for u in users) else f"vjob-u{job.uid}"
        with passwd_file.open("a") as fh:
            fh.write(f"{name}:x:{job.uid}:{job.gid}::{job.home}:/bin/bash\n")


_SIOCSIFFLAGS, _SIOCGIFFLAGS, _SIOCSIFADDR, _SIOCSIFNETMASK = 0x8914, 0x8913, 0x8916, 0x891C
_SIOCADDRT = 0x890B
_IFF_UP = 0x1
_RTF_UP, _RTF_GATEWAY = 0x1, 0x2
_RTENTRY = "@L16s16s16sHhLPhPLLH0L"
"""struct rtentry (linux/route.h), native alignment, padded to its size (120 bytes on x86_64)."""


def _ifreq(name: str, tail: bytes = b"") -> bytes:
    return struct.pack("16s", name.encode()) + tail.ljust(24, b"\0")


def _sockaddr(ip: str) -> bytes:
    return struct.pack("HH4s", socket.AF_INET, 0, socket.inet_aton(ip))


def _link_up(sock: socket.socket, name: str) -> None:
    flags = struct.unpack("16sH", fcntl.ioctl(sock, _SIOCGIFFLAGS, _ifreq(name))[:18])[1]
    fcntl.ioctl(sock, _SIOCSIFFLAGS, _ifreq(name, struct.pack("H", flags | _IFF_UP)))


def default_route(gateway: str) -> bytes:
    """The SIOCADDRT request for 0.0.0.0/0 via `gateway` (the kernel picks the interface whose
    network holds it)."""
    any_addr = _sockaddr("0.0.0.0").ljust(16, b"\0")
    via = _sockaddr(gateway).ljust(16, b"\0")
    return struct.pack(_RTENTRY, 0, any_addr, via, any_addr, _RTF_UP | _RTF_GATEWAY, *[0] * 8)


def _address(sock: socket.socket, name: str, ip: str, prefix: int) -> None:
    mask = str(ipaddress.IPv4Network(f"0.0.0.0/{prefix}").netmask)
    fcntl.ioctl(sock, _SIOCSIFADDR, _ifreq(name, _sockaddr(ip)))
    fcntl.ioctl(sock, _SIOCSIFNETMASK, _ifreq(name, _sockaddr(mask)))
    _link_up(sock, name)


def setup_nat(nat: Nat, etc: Path = Path("/etc")) -> str:
    """The NAT NIC's static address, the default route through the gateway (the same address
    at every site: nothing to redo after a move) and resolv.conf; returns the interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        name = interface_of(nat.mac)
        _address(sock, name, nat.ip, nat.prefix)
        with contextlib.suppress(FileExistsError):  # the agent runs once per boot: a route there is this one
            fcntl.ioctl(sock, _SIOCADDRT, default_route(nat.gateway))
    resolv = etc / "resolv.conf"
    resolv.unlink(missing_ok=True)  # often a link to a resolver's runtime file: replaced, not followed
    resolv.write_text("".join(f"nameserver {ip}\n" for ip in nat.dns))
    return name


def interface_of(mac: str, sys_net: Path = Path("/sys/class/net")) -> str:
    """The guest's interface with `mac` (the kernel's name, eth0 or ens3, is not ours to fix)."""
    for path in sorted(sys_net.iterdir()):
        try:
            if (path / "address").read_text().strip().lower() == mac:
                return path.name
        except OSError:
            continue
    raise JobError(f"network.mac: no interface with address {mac} in the guest")


def setup_network(net: Network, hostname: str, etc: Path = Path("/etc")) -> None:
    """Address the job's NIC (ioctl: the image has no iproute2), name every VM in /etc/hosts,
    write the host file, and start sshd with the job's key when the image has it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        _link_up(sock, "lo")
        name = interface_of(net.mac)
        _address(sock, name, net.ip, net.prefix)
    lines = ["127.0.0.1 localhost\n", *(f"{ip} {host}\n" for ip, host in net.peers)]
    (etc / "hosts").write_text("".join(lines))
    nodefile = etc / NODEFILE.relative_to("/etc")
    nodefile.parent.mkdir(mode=0o755, exist_ok=True)
    nodefile.write_text("".join(f"{host} slots=1\n" for _ip, host in net.peers))
    nodefile.chmod(0o644)
    _say(f"network: {name} {net.ip}/{net.prefix} as {hostname}, {len(net.peers)} VMs")
    if net.nat is not None:
        outside = setup_nat(net.nat, etc)
        _say(f"NAT: {outside} {net.nat.ip}/{net.nat.prefix} via {net.nat.gateway}")
    if net.bridged is not None:
        _say(site_net.bring_up(net.bridged, interface_of(net.bridged.mac), etc))


def wait_for_peers(net: Network, timeout_s: float = PEER_WAIT_S) -> list[str]:
    """Before the script starts on the first VM, every other VM answers on ssh's port: the VMs
    boot one after another (each job disk is built first), and a script's first `ssh vm1` must
    not meet a VM still booting. Returns the peers still silent at the timeout (the script
    then runs anyway, and is told on its stderr)."""
    waiting = [ip for ip, _host in net.peers if ip != net.ip]
    deadline = time.monotonic() + timeout_s
    while waiting and time.monotonic() < deadline:
        for ip in list(waiting):
            try:
                socket.create_connection((ip, 22), timeout=2).close()
                waiting.remove(ip)
            except OSError:
                continue
        if waiting:
            time.sleep(1)
    return waiting


def _say(text: str) -> None:
    print(f"VJOB-GUEST: {text}", flush=True)


def _run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL)


def _raw_tty(path: str) -> int:
    """A serial port opened for writing, in raw mode: the job's bytes reach the host as written."""
    fd = os.open(path, os.O_WRONLY | os.O_NOCTTY)
    with contextlib.suppress(termios.error):
        attrs = termios.tcgetattr(fd)
        attrs[1] &= ~termios.OPOST  # no \n -> \r\n
        termios.tcsetattr(fd, termios.TCSANOW, attrs)
    return fd


def _make_dirs_for(job: Job) -> None:
    """The home and the working directory exist at their host paths, the job's own."""
    for path in (job.home, job.cwd):
        missing = []
        p = Path(path)
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            d.mkdir(mode=0o755)
            os.chown(d, job.uid, job.gid)


def run_job(job: Job, script: Path, *, stdout: int, stderr: int) -> int:
    """Run the job as its user; returns the exit status (128+N when killed by signal N)."""
    env = dict(job.env)
    env.update({"HOME": job.home, "USER": job.user, "LOGNAME": job.user, "VJOB_GUEST": "1"})
    if job.network is not None:
        env["VJOB_NODEFILE"] = str(NODEFILE)
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    argv = [str(script), *job.argv[1:]]
    if not script.read_bytes().startswith(b"#!"):
        argv = ["/bin/sh", *argv]  # like a shell running a script without a #! line
    drop = {} if job.uid == 0 else {"user": job.uid, "group": job.gid, "extra_groups": [job.gid]}
    streams = {"stdin": subprocess.DEVNULL, "stdout": stdout, "stderr": stderr}
    try:
        child = subprocess.Popen(argv, cwd=job.cwd, env=env, start_new_session=True, **streams, **drop)
    except OSError as exc:
        os.write(stderr, f"vjob: cannot start the job: {exc}\n".encode())
        return 127 if isinstance(exc, FileNotFoundError) else 126
    code = child.wait()
    return 128 - code if code < 0 else code


def main() -> int:
    MOUNT.mkdir(exist_ok=True)
    _run(["mount", "-t", "ext4", "-o", "nosuid,nodev", JOB_DEVICE, str(MOUNT)])
    control = MOUNT / CONTROL
    raw = (control / "job.json").read_bytes()
    if len(raw) > MAX_JOB_JSON:
        raise JobError(f"job.json: {len(raw)} bytes, more than {MAX_JOB_JSON}")
    data = json.loads(raw)
    job, site = parse_job(data), mounts.parse_mounts(data.get("mounts") if isinstance(data, dict) else None)
    socket.sethostname(job.hostname)
    ensure_user(job)
    if job.network is not None:  # before the mounts: the site's filesystems come from the job network's gateway
        setup_network(job.network, job.hostname)
    if site is not None:  # the site's filesystems first: the working directory may be on one (used in place)
        mounts.mount_all(site)
    _make_dirs_for(job)
    if not mounts.covers(site, job.cwd):
        _run(["mount", "--bind", str(MOUNT / WORK), job.cwd])
    if job.network is not None:
        net = job.network
        ssh = job_ssh.start(job.uid, job.gid, [h for _ip, h in net.peers], net.ssh_private, net.ssh_public)
        if ssh:
            _say("sshd started")
        if not job.network.leader:
            _say("peer ready: the job's script runs on the first VM")
            while True:  # the pilot ends this VM with the job
                time.sleep(3600)
        silent = wait_for_peers(job.network) if ssh else []
        _say(f"peers reachable at uptime {time.clock_gettime(time.CLOCK_BOOTTIME):.2f}; silent: {silent}")
    script = control / "script"
    os.chmod(script, 0o755)
    stdout, stderr = _raw_tty(STDOUT_TTY), _raw_tty(STDERR_TTY)
    _say(f"starting the job as uid {job.uid} in {job.cwd} at uptime {time.clock_gettime(time.CLOCK_BOOTTIME):.2f}")
    code = run_job(job, script, stdout=stdout, stderr=stderr)
    _say(f"job exited with status {code}")
    for fd in (stdout, stderr):
        with contextlib.suppress(termios.error):
            termios.tcdrain(fd)
    subprocess.run(["umount", "-l", job.cwd], check=False)
    tmp = control / ".exit.tmp"
    tmp.write_text(f"{code}\n")
    os.replace(tmp, control / "exit")
    os.sync()
    subprocess.run(["umount", str(MOUNT)], check=False)
    os.sync()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # noqa: BLE001 - PID 1's child: say why on the console, never hang
        _say(f"agent failed: {type(exc).__name__}: {exc}")
        sys.exit(1)
