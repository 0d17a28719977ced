"""What `scontrol suspend` does to a process a job detached from itself, per ProctrackType.

Why: pause-first preemption (docs/preempt-pause.md) saves the paused VM from a process the
pilot detaches (double fork, a session of its own: pilot.pause_drain's drainer) while Slurm
holds the job suspended. Whether that process keeps running is the proctrack plugin's doing,
and `[agent] pause_first = "auto"` turns pause-first on only where it does
(plugins.slurm.proctrack). This measures it on a one-node Slurm cluster of its own (no guest,
no libvirt): a batch job whose script and detached child each write a heartbeat every 0.1 s,
suspended for 3 s, then resumed and cancelled; per plugin, whether each heartbeat went on while
the job was suspended, the detached process's state (T stopped, D frozen, S running) and
whether it outlived the job. Run as root, the dev cluster's lock held:

    flock /tmp/vjob-devcluster.lock .venv/bin/python -m devkit.suspend_probe   # ~2 min
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from devkit.devcluster import DevCluster, Settings
from devkit.devcluster_daemons import read_pid, start_daemon, wait_until
from vjob import proc

PORT = 6927
PLUGINS = ("proctrack/linuxproc", "proctrack/pgid", "proctrack/cgroup")
CGROUP_CONF = (
    "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\nConstrainCores=no\nConstrainRAMSpace=no\nConstrainDevices=no\n"
)
"""The shared notes' cgroup.conf for this machine's cgroup v1 hierarchy (its freezer included)."""
JOB = """#!/bin/bash
python3 - "{work}" <<'PY'
import os, sys, time
work = sys.argv[1]
def beat(name):
    with open(os.path.join(work, name), "a") as fh:
        while True:
            fh.write(f"{{time.time()}}\\n"); fh.flush(); time.sleep(0.1)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(os.path.join(work, "detached.pid"), "w").write(str(os.getpid()))
        beat("detached.beat")
    os._exit(0)
os.wait()
beat("script.beat")
PY
"""


def _lines(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except OSError:
        return 0


def _state(pid: int) -> str:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line.split()[1]
    except OSError:
        return "gone"
    return "?"


def _restart(cluster: DevCluster, plugin: str) -> None:
    """slurm.conf's ProctrackType set to `plugin`, the controller and its node restarted."""
    cluster.slurm.run("scontrol", ["shutdown"], timeout_s=15)
    pidfiles = [cluster.run / "slurmctld.pid", cluster.run / "slurmd-node1.pid"]
    wait_until(lambda: not any(proc.alive(read_pid(p)) for p in pidfiles), 30, "Slurm to stop")
    text = "".join(
        f"ProctrackType={plugin}\n" if line.startswith("ProctrackType=") else line
        for line in cluster.conf.read_text().splitlines(keepends=True)
    )
    cluster.conf.write_text(text)
    (cluster.conf.parent / "cgroup.conf").write_text(CGROUP_CONF)
    start_daemon(["/usr/sbin/slurmctld", "-f", str(cluster.conf)], "slurmctld", cluster.log)
    start_daemon(["/usr/sbin/slurmd", "-f", str(cluster.conf), "-N", "node1"], "slurmd node1", cluster.log)

    def idle() -> bool:
        try:
            return "idle" in cluster.slurm.run("sinfo", ["-h", "-N", "-o", "%t"], timeout_s=10)
        except Exception:  # noqa: BLE001 - not up yet
            return False

    wait_until(idle, 60, "node1 idle")


def probe(cluster: DevCluster, plugin: str, work: Path) -> dict[str, Any]:
    """One job under `plugin`: suspended 3 s, resumed, cancelled (see the module docstring)."""
    _restart(cluster, plugin)
    work.mkdir(mode=0o755)
    config = cluster.slurm.run("scontrol", ["show", "config"])
    shown = next((ln.split("=", 1)[1].strip() for ln in config.splitlines() if ln.startswith("ProctrackType")), "")
    script = work / "job.sh"
    script.write_text(JOB.format(work=work))
    out = cluster.slurm.run("sbatch", ["--parsable", "-c1", "--mem=100M", "-o", str(work / "out"), str(script)])
    job = out.strip().split(";")[0]
    beats = {n: work / f"{n}.beat" for n in ("script", "detached")}
    wait_until(lambda: all(_lines(p) > 5 for p in beats.values()), 60, f"job {job}'s heartbeats")
    pid = int((work / "detached.pid").read_text())
    cluster.slurm.run("scontrol", ["suspend", job])
    time.sleep(0.5)  # what was in flight lands
    before = {n: _lines(p) for n, p in beats.items()}
    time.sleep(3.0)
    during = {n: _lines(p) - before[n] for n, p in beats.items()}
    state = _state(pid)
    cluster.slurm.run("scontrol", ["resume", job])
    time.sleep(1.0)
    at = _lines(beats["detached"])
    time.sleep(1.0)
    resumed = _lines(beats["detached"]) - at
    cluster.slurm.run("scancel", [job])
    time.sleep(3.0)
    outlived = _state(pid) not in ("gone", "Z")
    if outlived:
        os.kill(pid, signal.SIGKILL)  # ours: started by this probe's job
    return {
        "proctrack": plugin,
        "show_config": shown,
        "script_beats_while_suspended": during["script"],
        "detached_beats_while_suspended": during["detached"],
        "detached_state_while_suspended": state,
        "detached_beats_after_resume": resumed,
        "detached_outlived_scancel": outlived,
    }


def _clean_cgroups() -> None:
    """The per-node hierarchies Slurm's cgroup/v1 left (the shared notes' advice)."""
    for top in Path("/sys/fs/cgroup").glob("*/slurm_node1"):
        subprocess.run(["find", str(top), "-depth", "-type", "d", "-exec", "rmdir", "{}", ";"], check=False)


def main() -> int:
    top = Path(tempfile.mkdtemp(prefix="vjob-suspendprobe-", dir="/var/tmp"))
    top.chmod(0o755)
    cluster = DevCluster(top / "cluster")
    rows = []
    try:
        cluster.up(
            Settings(run_dir=cluster.root, nodes=1, cpus=2, memory_mb=2048, agent="no", libvirt=False, port=PORT)
        )
        for plugin in PLUGINS:
            rows.append(probe(cluster, plugin, top / plugin.split("/")[1]))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        cluster.down()
        _clean_cgroups()
        shutil.rmtree(top, ignore_errors=True)
    print(json.dumps({"probe": "suspend_detached", "load_avg": [round(x, 2) for x in os.getloadavg()], "runs": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
