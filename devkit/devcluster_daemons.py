"""Starting and stopping the development cluster's daemons, each by the pid it left behind.

Why apart from the cluster's layout: these are the steps that touch processes (munged, the
forking Slurm daemons, the vjob agent) and the waits for them to answer; `down` must stop
exactly what `up` started, so every start leaves a pid file and every stop checks that the pid
still runs the program it started before signalling it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from vjob import proc
from vjob.errors import CommandError, VjobError


def start_munge(run: Path) -> None:
    """Start munged as the munge user (with a key, created if none) and copy its pid into `run`."""
    run_munge = Path("/run/munge")
    run_munge.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_munge, "munge", "munge")
    os.chmod(run_munge, 0o755)
    key = Path("/etc/munge/munge.key")
    if not key.exists() or key.stat().st_size == 0:
        run_checked(["mungekey", "--create", f"--keyfile={key}"])
        shutil.chown(key, "munge", "munge")
        os.chmod(key, 0o400)
    pidfile = run_munge / "munged.pid"  # munged runs as munge: it cannot write into our run dir
    pidfile.unlink(missing_ok=True)  # no munged answers, so any pid in it is stale
    run_checked(["runuser", "-u", "munge", "--", "/usr/sbin/munged", "--num-threads=10", f"--pid-file={pidfile}"])
    wait_until(munge_ok, 10, "munged")
    wait_until(lambda: read_pid(pidfile) is not None, 10, f"munged pid file {pidfile}")
    (run / "munged.pid").write_text(f"{read_pid(pidfile)}\n")


def start_daemon(cmd: list[str], what: str, log_dir: Path) -> None:
    """Start a daemon that forks itself into the background (it writes its own pid file)."""
    log = log_dir / "daemon-start.log"
    with log.open("a") as out:
        done = subprocess.run(cmd, stdout=out, stderr=out, stdin=subprocess.DEVNULL, timeout=60, check=False)
    if done.returncode != 0:
        raise VjobError(f"devcluster: {what} did not start (exit {done.returncode}); see {log} and {log_dir}")


def start_agent(
    vjob_toml: Path, env: Mapping[str, str], run: Path, log_dir: Path, progress: Callable[[str], None]
) -> str:
    """`vjob agent --rms slurm` on `vjob_toml` (its store upgraded first), unless ours runs: "started"/"running"."""
    pidfile = run / "agent.pid"
    if proc.alive(read_pid(pidfile)) and "agent" in cmdline(read_pid(pidfile) or 0):
        return "running"
    vjob = [sys.executable, "-m", "vjob.cli", "--config", str(vjob_toml)]
    full_env = {**os.environ, **env}
    proc_db = subprocess.run(
        [*vjob, "db", "upgrade"], capture_output=True, text=True, timeout=120, env=full_env, check=False
    )
    if proc_db.returncode != 0:
        raise VjobError(f"devcluster: vjob db upgrade failed: {proc_db.stderr.strip()[-400:]}")
    cmd = [*vjob, "agent", "--rms", "slurm"]
    with (log_dir / "agent.log").open("a") as out:
        agent = subprocess.Popen(
            cmd, stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=full_env, start_new_session=True
        )
    pidfile.write_text(f"{agent.pid}\n")
    time.sleep(1.0)
    if agent.poll() is not None:
        raise VjobError(f"devcluster: the vjob agent exited at once ({agent.returncode}); see {log_dir}/agent.log")
    progress(f"agent started (pid {agent.pid})")
    return "started"


def stop_pidfile(
    pidfile: Path, what: str, progress: Callable[[str], None], grace: float = 20.0, expect: str = ""
) -> None:
    """Stop the pid in `pidfile` if it is still the program we started (`expect` in its command)."""
    pid = read_pid(pidfile)
    if pid is None:
        return
    if proc.alive(pid) and expect in cmdline(pid):
        proc.stop_pid(pid, grace_s=grace)
        progress(f"{what} stopped (pid {pid})")
    pidfile.unlink(missing_ok=True)


def run_checked(cmd: Sequence[str]) -> None:
    """Run a short set-up command; CommandError with its output when it fails."""
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise CommandError(list(cmd), f"exited {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")


def munge_ok() -> bool:
    """Whether a munged answers (`munge -n` encodes a credential)."""
    try:
        done = subprocess.run(
            ["/usr/bin/munge", "-n"], stdin=subprocess.DEVNULL, capture_output=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def read_pid(path: Path) -> int | None:
    """The pid a pid file holds, None when it is missing or unreadable."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def port_open(port: int) -> bool:
    """Whether something listens on the local `port` (another cluster's slurmctld)."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def cmdline(pid: int) -> str:
    """The command line of `pid`, "" when it is gone: a reused pid is never stopped by mistake."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `predicate` every 0.1 s; VjobError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise VjobError(f"devcluster: {what} not ready after {timeout:.0f} s")
