"""The one-machine development cluster: munge, MariaDB + slurmdbd, slurmctld, N slurmd, libvirtd, the vjob agent.

Why one cluster behind `deploy/devcluster`: tests, benchmarks and the demo all need the same
cluster, brought up in about a second and torn down without touching anything this module did
not start. Every daemon it starts leaves a pid file in the run directory; `down` stops exactly
those pids (and munged only when `up` started it). Configuration files are generated from
deploy/slurm/ into the run directory, so a checkout never writes under /etc. What each file
holds is in devkit.devcluster_files; starting and stopping the daemons, in devkit.devcluster_daemons;
the accounting (MariaDB, slurmdbd), in devkit.devcluster_accounting.

Layout of the run directory (default /var/lib/vjob/devcluster, or $VJOB_DEVCLUSTER_DIR):
etc/ (slurm.conf, job_submit.lua, vjob-images.list, vjob-agent.wake, vjob.toml, env), state/,
spool/<node>/,
run/ (pid files, started.json), log/ (daemon logs), mysql/ (MariaDB's datadir and socket).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devkit import libvirtd
from devkit.devcluster_accounting import Accounting
from devkit.devcluster_daemons import (
    munge_ok,
    port_open,
    read_pid,
    start_agent,
    start_daemon,
    start_munge,
    stop_pidfile,
    wait_until,
)
from devkit.devcluster_files import catalogue_images, slurm_conf, vjob_toml, write_if_changed
from devkit.devcluster_hosts import Topology, plan
from plugins.slurm.commands import SlurmCommands
from plugins.slurm.environment import wake_file as slurm_wake_file
from plugins.slurm.images import SHIPPED_IMAGES, read_image_list, write_image_list
from vjob import proc
from vjob.errors import CommandError, InputError, UsageError, VjobError

REPO = Path(__file__).resolve().parents[1]
JOB_SUBMIT_LUA = REPO / "plugins" / "slurm" / "job_submit.lua"
ENV_DIR = "VJOB_DEVCLUSTER_DIR"
DEFAULT_DIR = Path("/var/lib/vjob/devcluster")
SLURM_USER = "slurm"
ENV_PORT = "VJOB_DEVCLUSTER_PORT"
CTLD_PORT = 6817
"""slurmctld's port; a second cluster on the same machine takes another (--port, $VJOB_DEVCLUSTER_PORT)."""
PORTS = tuple(range(CTLD_PORT, CTLD_PORT + 401, 10))
FIRST_NODE_PORT = 17001
"""slurmd ports: node i listens on FIRST_NODE_PORT + 100 * (port - CTLD_PORT) + i - 1."""


@dataclass(frozen=True)
class Settings:
    """What `up` builds: the node count and size, the controller's port, libvirt and the agent (checked here)."""

    run_dir: Path
    nodes: int = 8
    cpus: int = 4
    memory_mb: int = 4096
    agent: str = "auto"
    """auto: start `vjob agent --rms slurm` when vjob provides it; yes: require it; no: never."""
    libvirt: bool = True
    port: int = field(default_factory=lambda: default_port())
    """slurmctld's port; default $VJOB_DEVCLUSTER_PORT or 6817."""
    hosts: int = 1
    """1: every node on this machine; 2 or 3: the nodes split over network-namespace hosts
    (devkit.devcluster_hosts), each with its own libvirtd, directories, sshd and node service."""

    def __post_init__(self) -> None:
        if self.port not in PORTS:
            raise UsageError(f"--port {self.port}: must be one of {PORTS[0]}, {PORTS[1]}, ... {PORTS[-1]} (step 10)")
        if not 1 <= self.nodes <= 64:
            raise UsageError(f"--nodes {self.nodes}: must be between 1 and 64")
        if not 1 <= self.cpus <= 256:
            raise UsageError(f"--cpus {self.cpus}: must be between 1 and 256")
        if self.memory_mb < 256:
            raise UsageError(f"--memory-mb {self.memory_mb}: must be at least 256 (a small QEMU guest)")
        if self.hosts != 1:
            plan(self.hosts, self.nodes)  # refused here when the nodes do not split
        if self.agent not in ("auto", "yes", "no"):
            raise UsageError(f"--agent {self.agent}: must be auto, yes or no")


def default_run_dir() -> Path:
    """$VJOB_DEVCLUSTER_DIR, else /var/lib/vjob/devcluster."""
    return Path(os.environ.get(ENV_DIR) or DEFAULT_DIR)


def default_port() -> int:
    """$VJOB_DEVCLUSTER_PORT, else 6817: a second cluster on the machine sets another."""
    raw = os.environ.get(ENV_PORT, "")
    if raw and not raw.isdigit():
        raise UsageError(f"${ENV_PORT} = {raw!r}: must be a port number")
    return int(raw) if raw else CTLD_PORT


class DevCluster:
    """One development cluster, identified by its run directory."""

    def __init__(self, run_dir: Path | None = None) -> None:
        self.root = Path(run_dir or default_run_dir()).resolve()
        self.etc = self.root / "etc"
        self.run = self.root / "run"
        self.log = self.root / "log"
        self.conf = self.etc / "slurm.conf"
        self.slurm = SlurmCommands(conf=str(self.conf), timeout_s=15)

    # -- what other programs need -----------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """Environment variables for Slurm clients and vjob commands talking to this cluster."""
        return {"SLURM_CONF": str(self.conf), "VJOB_CONFIG": str(self.etc / "vjob.toml")}

    @property
    def image_list(self) -> Path:
        """The plain list of OS image names job_submit.lua accepts (next to slurm.conf)."""
        return self.etc / "vjob-images.list"

    @property
    def pilot_dir(self) -> Path:
        """`[agent] pilot_dir` of the cluster's vjob.toml (the default, <data_dir>/pilots)."""
        return self.root / "vjob" / "pilots"

    def sync_image_list(self) -> list[str]:
        """Add the catalogue's images (e.g. debian12 once `vjob image build` ran against this
        cluster's store) to the list job_submit.lua accepts. Names are only added, never
        removed: a test may have added one for its own run, and a list a test is using must
        not shrink under it."""
        current: list[str] = []
        if self.image_list.exists():
            try:
                current = read_image_list(self.image_list)
            except InputError:
                current = []
        names = sorted({*current, *SHIPPED_IMAGES, *catalogue_images(self.root / "vjob")})
        if names != current:
            write_image_list(self.image_list, names)
        return names

    @property
    def wake_file(self) -> Path:
        """The file job_submit.lua rewrites on an interactive job and the agent watches."""
        return slurm_wake_file(self.conf)

    def ensure_wake_file(self) -> None:
        """Create the wake file writable by SlurmUser (etc/ stays root's): job_submit.lua runs
        inside slurmctld as that user and can rewrite a file there, not create one."""
        path = self.wake_file
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise VjobError(f"devcluster: {path} must be a plain file (job_submit.lua writes to it)")
        if not path.exists():  # an existing file keeps its time: rewriting it would wake the agent
            path.touch()
        shutil.chown(path, SLURM_USER, SLURM_USER)
        os.chmod(path, 0o644)

    @property
    def port(self) -> int:
        """slurmctld's port of this cluster (as `up` recorded it)."""
        return int(self._started().get("port", CTLD_PORT))

    def node_names(self) -> list[str]:
        """node1..nodeN of the cluster `up` last recorded (none before the first `up`)."""
        started = self._started()
        count = int(started.get("nodes", 0))
        return [f"node{i}" for i in range(1, count + 1)]

    # -- up -----------------------------------------------------------------------------------
    def up(self, settings: Settings, progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
        """Bring every component up (idempotent) and return when all are ready."""
        t0 = time.monotonic()
        timings: dict[str, float] = {}
        started = self._started()
        if started.get("nodes") and int(started["nodes"]) != settings.nodes and self._ctld_alive():
            raise UsageError(
                f"the cluster in {self.root} runs {started['nodes']} nodes, not {settings.nodes}: "
                "run `deploy/devcluster down` first"
            )
        if int(started.get("hosts", 1)) != settings.hosts and self._ctld_alive():
            raise UsageError(
                f"the cluster in {self.root} runs on {started.get('hosts', 1)} host(s), not {settings.hosts}: "
                "run `deploy/devcluster down` first"
            )
        self._make_dirs(settings)
        if self._start_munge(started):
            progress("munged started")
        timings["munge_s"] = time.monotonic() - t0
        self._restart_without_accounting(progress)
        self._write_config(settings)
        started["nodes"] = settings.nodes
        started["port"] = settings.port
        started["hosts"] = settings.hosts
        self._save_started(started)
        ctld_alive = self._ctld_alive()
        if not ctld_alive and port_open(settings.port):
            raise UsageError(
                f"port {settings.port} is taken by another Slurm controller (another development cluster? "
                f"see `deploy/devcluster --dir DIR status`, or give this one --port); "
                f"the cluster in {self.root} cannot start"
            )
        timings.update(Accounting(self.root, settings.port).start("vjobdev", progress))  # before slurmctld
        if not ctld_alive:
            clean = not any((self.root / "state").iterdir())
            args = ["-f", str(self.conf)] + (["-c"] if clean else [])
            start_daemon(["/usr/sbin/slurmctld", *args], "slurmctld", self.log)
            progress("slurmctld started")
        hosts = plan(settings.hosts, settings.nodes) if settings.hosts > 1 else []
        topology = Topology(self.root)
        if hosts:
            topology.up(hosts, progress)
        for node in self._nodes(settings):
            if not proc.alive(read_pid(self.run / f"slurmd-{node}.pid")):
                where = topology.enter(topology.host_of(node).name) if hosts else []
                slurmd = [*where, "/usr/sbin/slurmd", "-f", str(self.conf), "-N", node]
                start_daemon(slurmd, f"slurmd {node}", self.log)
        wait_until(lambda: len(self._ready_nodes()) >= settings.nodes, 60, f"{settings.nodes} Slurm nodes")
        if not self._ctld_alive():  # the nodes answered, but through someone else's controller
            raise VjobError(f"devcluster: slurmctld of {self.root} is not running; see {self.log}/slurmctld.log")
        timings["slurm_s"] = time.monotonic() - t0
        progress(f"{settings.nodes} slurm nodes ready")
        if settings.libvirt:
            pids = self._start_libvirt(progress)
            started["libvirt_pids"] = sorted(set(started.get("libvirt_pids", [])) | set(pids))
            timings["libvirt_s"] = time.monotonic() - t0
        if settings.agent != "no":
            started["agent"] = start_agent(self.etc / "vjob.toml", self.env, self.run, self.log, progress)
        self._save_started(started)
        timings["total_s"] = time.monotonic() - t0
        return {"run_dir": str(self.root), "env": self.env, "timings": timings, "status": self.status()}

    def _restart_without_accounting(self, progress: Callable[[str], None]) -> None:
        """A controller started before the cluster had slurmdbd (its slurm.conf says so) is
        shut down with its slurmds, jobs kept: a reconfigure cannot switch accounting on."""
        if not self._ctld_alive() or "accounting_storage/slurmdbd" in self.conf.read_text():
            return
        progress("restarting Slurm with accounting (slurmdbd)")
        self.slurm.run("scontrol", ["shutdown"], timeout_s=15)
        pidfiles = [self.run / "slurmctld.pid", *self.run.glob("slurmd-*.pid")]
        wait_until(lambda: not any(proc.alive(read_pid(p)) for p in pidfiles), 30, "Slurm's daemons to stop")

    def _make_dirs(self, settings: Settings) -> None:
        """The run directory's tree, each part owned and moded for whoever writes there."""
        for sub in ("etc", "run", "log", "state", "spool"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for node in self._nodes(settings):
            (self.root / "spool" / node).mkdir(exist_ok=True)
        os.chmod(self.root, 0o755)
        os.chmod(self.run, 0o755)
        # The pilots of ordinary users' jobs create their own directory there (agent.pilot_dir):
        # world-writable and sticky, like /tmp, so nobody can remove another's.
        self.pilot_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.pilot_dir.parent, 0o755)
        os.chmod(self.pilot_dir, 0o1777)
        for sub in ("state", "log"):
            shutil.chown(self.root / sub, SLURM_USER, SLURM_USER)

    def _write_config(self, settings: Settings) -> None:
        """slurm.conf (the controller reconfigured if it changed), job_submit.lua, the image list,
        the wake file, vjob.toml and the shell `env` file."""
        first_node_port = FIRST_NODE_PORT + 100 * (settings.port - CTLD_PORT)
        text = slurm_conf(
            self.root,
            nodes=settings.nodes,
            cpus=settings.cpus,
            memory_mb=settings.memory_mb,
            port=settings.port,
            first_node_port=first_node_port,
            hosts=plan(settings.hosts, settings.nodes) if settings.hosts > 1 else None,
        )
        if write_if_changed(self.conf, text, 0o644) and self._ctld_alive():
            self.slurm.run("scontrol", ["reconfigure"])
        write_if_changed(self.etc / "job_submit.lua", JOB_SUBMIT_LUA.read_text(), 0o644)
        self.sync_image_list()
        self.ensure_wake_file()
        write_if_changed(self.etc / "vjob.toml", vjob_toml(self.root, self.conf, self.image_list), 0o644)
        env = "".join(f"export {k}={v}\n" for k, v in self.env.items())
        write_if_changed(self.etc / "env", env, 0o644)

    def _start_munge(self, started: dict[str, Any]) -> bool:
        """Start munged unless one answers already; remember that we did, so `down` stops it."""
        if munge_ok():
            return False
        start_munge(self.run)
        started["munged"] = True
        self._save_started(started)
        return True

    def _start_libvirt(self, progress: Callable[[str], None]) -> list[int]:
        """virtlogd + libvirtd through devkit.libvirtd; returns the pids it started."""
        daemons = libvirtd.start_system(self.log / "libvirt")
        progress(f"libvirtd ready ({'started' if daemons.owned else 'already running'})")
        return list(daemons.started_pids)

    # -- status ---------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """What runs now: each component and each node's Slurm state."""
        started = self._started()
        nodes = self.node_names()
        slurmd = {n: proc.alive(read_pid(self.run / f"slurmd-{n}.pid")) for n in nodes}
        node_states = self._node_states() if self._ctld_alive() else {}
        libvirt = "running" if libvirtd.reachable(libvirtd.SYSTEM_URI, timeout_s=5) else "not running"
        if started.get("libvirt_pids"):
            libvirt += f" (started by devcluster: pids {started['libvirt_pids']})"
        agent_pid = read_pid(self.run / "agent.pid")
        accounting = Accounting(self.root, int(started.get("port", CTLD_PORT)))
        return {
            "run_dir": str(self.root),
            "munged": munge_ok(),
            "slurmctld": self._ctld_alive(),
            "mariadb": accounting.db_alive(),
            "slurmdbd": accounting.dbd_alive(),
            "slurmd": slurmd,
            "nodes": node_states,
            "libvirt": libvirt,
            "hosts": {h.name: f"{h.address} {','.join(h.nodes)}" for h in Topology(self.root).hosts()},
            "agent": "running" if proc.alive(agent_pid) else started.get("agent", "not started"),
            "up": bool(nodes) and self._ctld_alive() and all(slurmd.values()) and accounting.dbd_alive(),
        }

    def is_up(self) -> bool:
        """Every daemon runs and every node is ready for jobs."""
        return bool(self.status()["up"]) and len(self._ready_nodes()) >= len(self.node_names())

    def _ctld_alive(self) -> bool:
        """Our slurmctld runs (by its pid file) and answers a ping."""
        if not proc.alive(read_pid(self.run / "slurmctld.pid")):
            return False
        try:
            self.slurm.run("scontrol", ["ping"], timeout_s=5)
        except CommandError:
            return False
        return True

    def _node_states(self) -> dict[str, str]:
        """Each node's Slurm state as sinfo says it ({} when the controller does not answer)."""
        try:
            out = self.slurm.run("sinfo", ["-h", "-N", "-o", "%N %T"], timeout_s=5)
        except CommandError:
            return {}
        states: dict[str, str] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def _ready_nodes(self) -> list[str]:
        """The nodes that can take jobs: responding (no `*`) and idle, allocated, mixed or completing."""
        usable = ("idle", "allocated", "mixed", "completing")
        return [n for n, s in self._node_states().items() if s.rstrip("*~#!%$@^-") in usable and not s.endswith("*")]

    # -- down -------------------------------------------------------------------------------------
    def down(self, *, keep_state: bool = False, progress: Callable[[str], None] = lambda _m: None) -> None:
        """Stop what `up` started, by pid; forget the jobs unless `keep_state`."""
        started = self._started()
        stop_pidfile(self.run / "agent.pid", "agent", progress, expect="agent")
        if self._ctld_alive():
            if not keep_state:
                self._cancel_all_jobs()
            try:
                self.slurm.run("scontrol", ["shutdown"], timeout_s=15)
            except CommandError as exc:
                progress(f"scontrol shutdown failed ({exc}); stopping the daemons by pid")
        for pidfile in [*sorted(self.run.glob("slurmd-*.pid")), self.run / "slurmctld.pid"]:
            stop_pidfile(pidfile, pidfile.stem, progress, grace=10.0, expect="slurm")
        Topology(self.root).down(progress)  # the hosts' daemons, namespaces and bridge, if any
        # after the controller (it sends slurmdbd what it still holds), before munged
        Accounting(self.root, int(started.get("port", CTLD_PORT))).stop(keep_records=keep_state, progress=progress)
        if started.get("libvirt_pids"):
            libvirtd.stop(libvirtd.Daemons(uri=libvirtd.SYSTEM_URI, started_pids=list(started["libvirt_pids"])))
            progress(f"libvirtd stopped (pids {started['libvirt_pids']})")
        if started.get("munged"):
            stop_pidfile(self.run / "munged.pid", "munged", progress, expect="munged")
        if not keep_state:
            for sub in ("state", "spool"):
                shutil.rmtree(self.root / sub, ignore_errors=True)
        (self.run / "started.json").unlink(missing_ok=True)

    def _cancel_all_jobs(self) -> None:
        """Cancel the jobs of this cluster so that no job step outlives its slurmd."""
        try:
            out = self.slurm.run("squeue", ["-h", "-o", "%A"], timeout_s=10)
        except CommandError:
            return
        ids = out.split()
        if not ids:
            return
        try:
            self.slurm.run("scancel", ids, timeout_s=15)
        except CommandError:
            return
        _wait_quiet(lambda: not self.slurm.run("squeue", ["-h", "-t", "R,CG,S", "-o", "%A"], timeout_s=10).split(), 20)

    # -- bookkeeping --------------------------------------------------------------------------------
    def _started(self) -> dict[str, Any]:
        """started.json: what `up` started and with which settings, so `down` stops only that."""
        path = self.run / "started.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save_started(self, data: dict[str, Any]) -> None:
        """Write started.json atomically (a `down` racing an `up` never reads half of it)."""
        self.run.mkdir(parents=True, exist_ok=True)
        tmp = self.run / "started.json.tmp"
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(self.run / "started.json")

    @staticmethod
    def _nodes(settings: Settings) -> list[str]:
        """The node names `settings` asks for."""
        return [f"node{i}" for i in range(1, settings.nodes + 1)]


def _wait_quiet(predicate: Callable[[], bool], timeout: float) -> None:
    """Poll `predicate` every 0.2 s until it holds, `timeout` passes or Slurm stops answering."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except CommandError:
            return
        time.sleep(0.2)
