"""Two (or more) hosts on one machine for the development cluster: `deploy/devcluster up --hosts 2`.

Why: on the one-host cluster every slurmd "node" shares this machine's libvirtd, directories
and loopback, so a resume "on another node" moves no bytes and a path that only works because
everything is one filesystem goes unnoticed. Here each host is a network namespace (a veth into
the bridge `vjhosts0` in the root namespace, an address in 198.18.250.0/24, no default route)
AND a persistent mount + UTS namespace (a holder process, `sleep infinity` under `unshare`,
entered with `nsenter -t PID -m -u -n`) in which private mounts hide the other hosts' files:

- tmpfs over /run/libvirt, /run/user, /run/vjob, /var/cache/libvirt, /var/log/libvirt: each host
  its own system libvirtd and the users' session daemons and ssh control sockets;
- binds of per-host directories (under <run dir>/hosts/<host>/) over /var/lib/libvirt,
  /etc/libvirt (a copy with its own host_uuid and no autostarted network), the cluster's root
  VM and snapshot directories (<run dir>/vjob/vms, snapshots) and the node-local user
  directory <run dir>/local (where `[provisioning] user_vm_dir` puts users' VMs);
- /etc/ssh/ssh_config: the site's, naming the hosts (`hosta`, `hostb`) and the key each user
  was given (`enrol`), as a site's configuration management would;
- /etc/hosts: the machine's plus each host's address named by the host and its nodes (a
  site's name service: a leader pilot listens on its route toward its first member's node).

Each host runs virtlogd, a system libvirtd (under tini, the reaper this machine lacks), an sshd
on port 22 of its address, a `vjob node-service` on /run/vjob/node.sock serving its own nodes,
and its slurmds (node1,3,5,7 on host A, node2,4,6,8 on host B, NodeAddr the host's address);
its node service joins a multi-node job's bridge to the other host by VXLAN over the hosts' /24
(`[node] tunnel_networks`; the veths' MTU 1600 leaves room for the tunnel's 50 bytes);
slurmctld, slurmdbd and munged stay in the root namespace (slurmctld on 198.18.250.1 too).
Shared between hosts: the wire, the controller's state, munge's socket, slurm.conf, the home
directories (a site's NFS home), the site's installed files (this checkout, the image catalogue,
the pilot directory the agent reads: `agent.pilot_dir` must be shared). Every process started
here is recorded by pid and stopped by pid at `down`; the namespaces, the veths and the bridge
are removed.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devkit.devcluster_daemons import cmdline, read_pid, run_checked, wait_until
from provisioning import kvm_access
from vjob import proc
from vjob.errors import VjobError

NET = "198.18.250"
"""The hosts' /24 (RFC 2544 benchmarking space: never routed anywhere)."""
BRIDGE = "vjhosts0"
CONTROLLER_ADDR = f"{NET}.1"
HOST_NAMES = ("hosta", "hostb", "hostc")
SOCKET = "/run/vjob/node.sock"
"""The node service's socket on every host (the same path: one site configuration)."""
TMPFS_DIRS = ("/run/libvirt", "/run/user", "/run/vjob", "/var/cache/libvirt", "/var/log/libvirt")
REPO = Path(__file__).resolve().parents[1]
MTU = "1600"
"""The hosts' links: a guest's full 1500-byte frame plus VXLAN's 50 bytes (no fragmentation)."""
HOST_UUIDS = ("6a0b1c2d-0000-4000-8000-0000000000a1", "6a0b1c2d-0000-4000-8000-0000000000b2")


@dataclass(frozen=True)
class Host:
    """One host: its name, address, network namespace and the nodes its slurmds serve."""

    name: str
    address: str
    nodes: tuple[str, ...]

    @property
    def netns(self) -> str:
        return f"vjob-{self.name}"

    @property
    def veth(self) -> str:
        return f"vjh-{self.name[-1]}"


def plan(hosts: int, nodes: int) -> list[Host]:
    """The hosts of a cluster of `nodes` nodes dealt round the hosts (host A node1,3,5,7, host B
    node2,4,6,8). Why dealt, not split in runs: Slurm orders a job's nodes by name and rank 0's VM
    is on the first, so only interleaved hosts let a job resumed on the next free nodes start on
    the other host — the multi-node job of tests/test_two_hosts_slurm.py resumes with its hosts
    swapped (VM 0 from host A to host B, VM 1 from B to A)."""
    if not 2 <= hosts <= len(HOST_NAMES):
        raise VjobError(f"--hosts {hosts}: must be 1 (this machine) or 2..{len(HOST_NAMES)}")
    if nodes % hosts:
        raise VjobError(f"--nodes {nodes} does not split evenly over {hosts} hosts")
    return [
        Host(HOST_NAMES[i], f"{NET}.{11 + i}", tuple(f"node{n}" for n in range(i + 1, nodes + 1, hosts)))
        for i in range(hosts)
    ]


def node_lines(hosts: list[Host], *, host: str, cpus: int, memory_mb: int, first_port: int) -> str:
    """slurm.conf's NodeName lines: one per node (the hosts' nodes interleave), each with its
    host's NodeAddr and its own slurmd port."""
    by_number = sorted((int(n.removeprefix("node")), h) for h in hosts for n in h.nodes)
    return "\n".join(
        f"NodeName=node{n} NodeHostname={host} NodeAddr={h.address} "
        f"Port={first_port + n - 1} CPUs={cpus} Boards=1 SocketsPerBoard=1 "
        f"CoresPerSocket={cpus} ThreadsPerCore=1 RealMemory={memory_mb} State=UNKNOWN"
        for n, h in by_number
    )


class Topology:
    """The hosts of one development cluster (its run directory `root`)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.base = root / "hosts"
        self.record = root / "run" / "hosts.json"

    # -- what others need ----------------------------------------------------------------------
    def hosts(self) -> list[Host]:
        """The hosts `up` recorded (none when the cluster runs on one host)."""
        data = self._read()
        return [Host(h["name"], h["address"], tuple(h["nodes"])) for h in data.get("hosts", [])]

    def holder(self, host: str) -> int:
        """The pid whose namespaces are the host's (nsenter's target)."""
        pid = self._read().get("holders", {}).get(host)
        if not isinstance(pid, int) or not proc.alive(pid):
            raise VjobError(f"devcluster: host {host} is not up (no holder process)")
        return pid

    def enter(self, host: str) -> list[str]:
        """The command prefix that runs a program on `host` (its mount, UTS and network namespaces)."""
        return ["nsenter", "-t", str(self.holder(host)), "-m", "-u", "-n", "--"]

    def host_of(self, node: str) -> Host:
        for h in self.hosts():
            if node in h.nodes:
                return h
        raise VjobError(f"devcluster: node {node} is on no host of the topology")

    @property
    def local_dir(self) -> Path:
        """The node-local directory for users' VMs (`[provisioning] user_vm_dir` under it)."""
        return self.root / "local"

    @property
    def ssh_dir(self) -> Path:
        return self.base / "ssh"

    def enrol(self, user: str) -> Path:
        """Give `user` a key every host's sshd accepts and every host's ssh offers: the stand-in
        for a site's host-based authentication between compute nodes. Returns the private key."""
        pw = pwd.getpwnam(user)
        if spwd_locked(user):  # `useradd` leaves "!": sshd refuses a locked account even a key
            run_checked(["usermod", "-p", "*", user])  # no password, not locked: keys only
        users = self.ssh_dir / "users"
        key = users / f"{user}.key"
        if not key.exists():
            run_checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{user}@devcluster", "-f", str(key)])
            shutil.copyfile(f"{key}.pub", users / f"{user}.pub")
            os.chown(key, pw.pw_uid, pw.pw_gid)
            key.chmod(0o600)
        return key

    # -- up ------------------------------------------------------------------------------------
    def up(self, hosts: list[Host], progress: Callable[[str], None]) -> dict[str, Any]:
        """Bridge, namespaces, mounts and every host's daemons except its slurmds (the cluster
        starts those with `enter`, after slurm.conf names the hosts)."""
        data = self._read()
        if data.get("hosts") and all(proc.alive(p) for p in data.get("holders", {}).values()):
            return data
        if data:
            self.down(progress)
        data = {"hosts": [{"name": h.name, "address": h.address, "nodes": list(h.nodes)} for h in hosts]}
        data.update(holders={}, pids={}, netns=[], bridge=False)
        self._write(data)
        self._bridge(data)
        self._ssh_files(hosts)
        for h in hosts:
            self._host(h, data, progress)
        return data

    def _bridge(self, data: dict[str, Any]) -> None:
        if not _link_exists(BRIDGE):
            run_checked(["ip", "link", "add", BRIDGE, "type", "bridge", "stp_state", "0"])
        data["bridge"] = True
        self._write(data)
        _ip_quiet(["ip", "addr", "add", f"{CONTROLLER_ADDR}/24", "dev", BRIDGE])
        run_checked(["ip", "link", "set", BRIDGE, "up"])

    def _host(self, h: Host, data: dict[str, Any], progress: Callable[[str], None]) -> None:
        run_checked(["ip", "netns", "add", h.netns])
        data["netns"].append(h.netns)
        self._write(data)
        veth = ["ip", "link", "add", h.veth, "mtu", MTU, "type", "veth"]
        run_checked([*veth, "peer", "name", "eth0", "mtu", MTU, "netns", h.netns])
        run_checked(["ip", "link", "set", h.veth, "master", BRIDGE, "up"])
        inside = ["ip", "netns", "exec", h.netns]
        run_checked([*inside, "ip", "addr", "add", f"{h.address}/24", "dev", "eth0"])
        run_checked([*inside, "ip", "link", "set", "eth0", "up"])
        run_checked([*inside, "ip", "link", "set", "lo", "up"])
        # Not under `ip netns exec`: it remounts /sys and so drops the cgroup mounts slurmd needs
        # (the host's own sysfs is mounted in `_mounts`, the cgroup tree moved onto it).
        netns = f"--net=/run/netns/{h.netns}"
        holder = subprocess.Popen(
            [
                "nsenter",
                netns,
                "--",
                "unshare",
                "--mount",
                "--uts",
                "--propagation",
                "private",
                "--",
                "sleep",
                "infinity",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        data["holders"][h.name] = holder.pid
        self._write(data)
        own = f"/proc/{holder.pid}/ns/mnt"
        wait_until(lambda: os.readlink(own) != os.readlink("/proc/self/ns/mnt"), 10, f"host {h.name}'s namespaces")
        self._mounts(h)
        pids = data["pids"].setdefault(h.name, {})
        for what, start in (
            ("libvirtd", self._libvirtd),
            ("sshd", self._sshd),
            ("node-service", self._node_service),
        ):
            started = start(h)
            pids.update(started)
            self._write(data)
            progress(f"{h.name}: {what} started ({', '.join(f'{k} {v}' for k, v in started.items())})")

    def _mounts(self, h: Host) -> None:
        """The host's private mounts, made inside its mount namespace."""
        mine = self.base / h.name
        index = HOST_NAMES.index(h.name)
        varlib, etc = mine / "var-lib-libvirt", mine / "etc-libvirt"
        _prepare_libvirt(varlib, etc, HOST_UUIDS[index % len(HOST_UUIDS)])
        binds = {
            varlib: Path("/var/lib/libvirt"),
            etc: Path("/etc/libvirt"),
            mine / "vms": self.root / "vjob" / "vms",
            mine / "snapshots": self.root / "vjob" / "snapshots",
            mine / "local": self.local_dir,
            self.ssh_dir / "ssh_config": Path("/etc/ssh/ssh_config"),
            self.base / "etc-hosts": Path("/etc/hosts"),
        }
        for src, dst in binds.items():
            if src.suffix == "" and src.name not in ("ssh_config", "etc-hosts"):
                src.mkdir(parents=True, exist_ok=True)
                dst.mkdir(parents=True, exist_ok=True)
        (mine / "local").chmod(0o1777)  # users make their own directory there, as under /tmp
        self.local_dir.chmod(0o755)
        (mine / "vms").chmod(0o711)
        (mine / "snapshots").chmod(0o700)
        enter = ["nsenter", "-t", str(self._read()["holders"][h.name]), "-m", "-u", "-n", "--"]
        run_checked([*enter, "hostname", h.name])
        # The host's own sysfs (its network devices under /sys/class/net), the machine's cgroup
        # tree kept on it: held aside by a bind, then moved back under the new /sys.
        aside = mine / "cgroup"
        aside.mkdir(exist_ok=True)
        run_checked([*enter, "mount", "--rbind", "/sys/fs/cgroup", str(aside)])
        run_checked([*enter, "mount", "-t", "sysfs", f"vjob-{h.name}", "/sys"])
        run_checked([*enter, "mount", "--move", str(aside), "/sys/fs/cgroup"])
        for path in TMPFS_DIRS:
            Path(path).mkdir(parents=True, exist_ok=True)
            run_checked([*enter, "mount", "-t", "tmpfs", "-o", "mode=0755,size=256m", f"vjob-{h.name}", path])
        for src, dst in binds.items():
            run_checked([*enter, "mount", "--bind", str(src), str(dst)])
        run_checked([*enter, "chmod", "1777", "/run/user"])  # each user's runtime directory is made there

    def _libvirtd(self, h: Host) -> dict[str, int]:
        """virtlogd and the system libvirtd of the host (its own sockets under /run/libvirt)."""
        kvm_access.grant_kvm_group()  # as devkit.libvirtd does: no udev here, /dev is the machine's
        root = Path(f"/proc/{self.holder(h.name)}/root")
        return start_libvirtd(self.enter(h.name), root, self.base / h.name / "libvirtd.log", h.name)

    def _sshd(self, h: Host) -> dict[str, int]:
        """sshd on port 22 of the host's address: how nodes copy VM files to each other."""
        mine = self.base / h.name
        key = mine / "ssh_host_ed25519_key"
        config = mine / "sshd_config"
        config.write_text(
            f"Port 22\nListenAddress {h.address}\nHostKey {key}\nPidFile /run/vjob/sshd.pid\n"
            f"AuthorizedKeysFile {self.ssh_dir}/users/%u.pub\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "MaxStartups 100\nMaxSessions 100\n"
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        with (mine / "sshd.log").open("ab") as out:
            sshd = subprocess.Popen(
                [*self.enter(h.name), "/usr/sbin/sshd", "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(lambda: _listens(h.address, 22) or sshd.poll() is not None, 20, f"{h.name}'s sshd")
        if sshd.poll() is not None:
            raise VjobError(f"devcluster: sshd of {h.name} exited ({sshd.returncode}); see {mine / 'sshd.log'}")
        return {"sshd": sshd.pid}

    def _node_service(self, h: Host) -> dict[str, int]:
        """`vjob node-service` for the host's nodes on /run/vjob/node.sock (the host's own), its
        job networks joined across the hosts' /24 by VXLAN (provisioning.node_service.tunnel)."""
        mine = self.base / h.name
        base = (self.root / "etc" / "vjob.toml").read_text()
        names = ", ".join(f'"{n}"' for n in h.nodes)
        config = mine / "node-service.toml"
        config.write_text(
            f'{base.rstrip()}\n\n[node]\nsocket = "{SOCKET}"\nnames = [{names}]\nrms = "slurm"\n'
            f'tunnel_networks = ["{NET}.0/24"]\n'  # a job's bridge joined to its other host's (VXLAN)
        )
        config.chmod(0o644)
        env = {**os.environ, "VJOB_CONFIG": str(config), "SLURM_CONF": str(self.root / "etc" / "slurm.conf")}
        env.pop("NOTIFY_SOCKET", None)
        with (mine / "node-service.log").open("ab") as out:
            service = subprocess.Popen(
                [*self.enter(h.name), sys.executable, "-m", "vjob.cli", "node-service"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                start_new_session=True,
            )
        sock = Path(f"/proc/{self.holder(h.name)}/root") / SOCKET.lstrip("/")
        wait_until(lambda: sock.exists() or service.poll() is not None, 60, f"{h.name}'s node service")
        if service.poll() is not None:
            raise VjobError(f"devcluster: the node service of {h.name} exited; see {mine / 'node-service.log'}")
        return {"node-service": service.pid}

    def _ssh_files(self, hosts: list[Host]) -> None:
        """Host keys, the known hosts file and the site's ssh_config every host mounts."""
        (self.ssh_dir / "users").mkdir(parents=True, exist_ok=True)
        self.ssh_dir.chmod(0o755)
        (self.ssh_dir / "users").chmod(0o755)
        known = []
        for h in hosts:
            mine = self.base / h.name
            mine.mkdir(parents=True, exist_ok=True)
            mine.chmod(0o755)
            key = mine / "ssh_host_ed25519_key"
            if not key.exists():
                run_checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)])
            kind, blob = Path(f"{key}.pub").read_text().split()[:2]
            known.append(f"{h.name},{h.address} {kind} {blob}")
        (self.ssh_dir / "known_hosts").write_text("\n".join(known) + "\n")
        names = " ".join(h.name for h in hosts)
        site = "".join(f"Host {h.name}\n  HostName {h.address}\n" for h in hosts)
        site += (
            f"Host {names}\n  IdentityFile {self.ssh_dir}/users/%u.key\n  IdentitiesOnly yes\n"
            f"  GlobalKnownHostsFile {self.ssh_dir / 'known_hosts'}\n  UserKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n\n"
        )
        (self.ssh_dir / "ssh_config").write_text(site + Path("/etc/ssh/ssh_config").read_text())
        (self.ssh_dir / "ssh_config").chmod(0o644)
        # the site's name service: each node's name is its host's address (a member pilot finds
        # its leader's address by the route toward a node's name, pilot.members.leader)
        names = "".join(f"{h.address} {h.name} {' '.join(h.nodes)}\n" for h in hosts)
        (self.base / "etc-hosts").write_text(Path("/etc/hosts").read_text().rstrip("\n") + "\n" + names)
        (self.base / "etc-hosts").chmod(0o644)

    # -- down ----------------------------------------------------------------------------------
    def down(self, progress: Callable[[str], None]) -> None:
        """Stop every process of the hosts by pid (ours first, then whatever still runs in their
        namespaces: users' session libvirtds and their QEMUs, started there by jobs), remove the
        namespaces and the bridge."""
        data = self._read()
        for host, pids in data.get("pids", {}).items():
            for what, pid in pids.items():
                if proc.alive(pid) and cmdline(pid):
                    proc.stop_pid(pid, grace_s=15.0)
                    progress(f"{host}: {what} stopped (pid {pid})")
        for netns in data.get("netns", []):
            for pid in _netns_pids(netns):
                if pid not in data.get("holders", {}).values() and proc.alive(pid):
                    progress(f"{netns}: stopping pid {pid} ({cmdline(pid)[:60].strip()})")
                    proc.stop_pid(pid, grace_s=10.0)
        for host, pid in data.get("holders", {}).items():
            if proc.alive(pid) and "sleep" in cmdline(pid):
                proc.stop_pid(pid, grace_s=5.0)
                progress(f"{host}: namespaces released (holder pid {pid})")
        for netns in data.get("netns", []):
            _ip_quiet(["ip", "netns", "del", netns])
        if data.get("bridge"):
            _ip_quiet(["ip", "link", "del", BRIDGE])
        self.record.unlink(missing_ok=True)

    # -- bookkeeping -----------------------------------------------------------------------------
    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.record.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, data: dict[str, Any]) -> None:
        self.record.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.record.with_name("hosts.json.tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(self.record)


def _prepare_libvirt(varlib: Path, etc: Path, host_uuid: str) -> None:
    """A host's /var/lib/libvirt and /etc/libvirt: a copy of this machine's configuration with
    its own host_uuid, no cgroup controllers (two daemons would fight over them), no persistent
    domain or autostarted network of the machine's."""
    if not (etc / "libvirtd.conf").exists():
        shutil.copytree("/etc/libvirt", etc, dirs_exist_ok=True, symlinks=True)
        for xml in (etc / "qemu").glob("*.xml"):
            xml.unlink()
        shutil.rmtree(etc / "qemu" / "networks" / "autostart", ignore_errors=True)
        with open(etc / "libvirtd.conf", "a") as conf:
            conf.write(f'\nhost_uuid = "{host_uuid}"\n')
        with open(etc / "qemu.conf", "a") as conf:
            conf.write("\ncgroup_controllers = [ ]\n")
    qemu = varlib / "qemu"
    for sub in ("channel/target", "checkpoint", "dump", "nvram", "ram", "save", "snapshot"):
        (qemu / sub).mkdir(parents=True, exist_ok=True)
    (varlib / "images").mkdir(parents=True, exist_ok=True)
    run_checked(["chown", "-R", "libvirt-qemu:libvirt-qemu", str(qemu)])
    qemu.chmod(0o750)
    varlib.chmod(0o755)


def spwd_locked(user: str) -> bool:
    """Whether /etc/shadow marks `user`'s password locked (a leading "!")."""
    for line in Path("/etc/shadow").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name == user:
            return rest.startswith("!")
    return False


def _virsh_ok(enter: list[str]) -> bool:
    done = subprocess.run(
        [*enter, "virsh", "-c", "qemu:///system", "uri"], capture_output=True, timeout=20, check=False
    )
    return done.returncode == 0


def _listens(address: str, port: int) -> bool:
    """Whether `address:port` answers, asked from the root namespace over the bridge."""
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((address, port)) == 0


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True, timeout=10, check=False).returncode == 0


def _ip_quiet(cmd: list[str]) -> None:
    """An `ip` call whose failure only means it was done already (an address present, a link gone)."""
    subprocess.run(cmd, capture_output=True, timeout=20, check=False)


def _netns_pids(netns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=10, check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def start_libvirtd(enter: list[str], root: Path, log: Path, host: str) -> dict[str, int]:
    """virtlogd and the system libvirtd started inside a host's namespaces (`enter`), their pid
    files read through `root` (the host's /proc/<pid>/root); their pids. Shared by the two-host
    dev cluster and the suite's wire host (tests/services/wire_host.py)."""
    run_checked([*enter, "virtlogd", "-d", "-p", "/run/libvirt/virtlogd.pid"])
    wait_until(lambda: read_pid(root / "run/libvirt/virtlogd.pid") is not None, 10, f"{host}'s virtlogd")
    virtlogd = read_pid(root / "run/libvirt/virtlogd.pid") or 0
    with log.open("ab") as out:
        daemon = subprocess.Popen(
            [*enter, "tini", "-s", "--", "libvirtd", "-p", "/run/libvirt/libvirtd.pid"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    wait_until(lambda: _virsh_ok(enter) or daemon.poll() is not None, 60, f"{host}'s libvirtd")
    if daemon.poll() is not None:
        raise VjobError(f"the libvirtd of {host} exited ({daemon.returncode}); see {log}")
    return {"libvirtd": daemon.pid, "virtlogd": virtlogd}
