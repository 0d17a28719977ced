"""One preemption on a one-node Slurm cluster, as a site would see it: a batch vjob of an
ordinary user whose guest filled its memory, an interactive `srun` that needs its CPUs, the
vjob agent between them — checkpointing save-first (the VM saved, then the job requeue-held)
or pause-first (`[agent] pause_first`: the VM paused, the job suspended so its CPUs are free,
the save drained, then the requeue-hold; docs/preempt-pause.md).

Shared by bench/preempt_pause.py (both modes, 1-4 GiB guests, the interactive start timed) and
tests/test_preempt_pause_slurm.py (pause-first, a small guest, resumed with its memory checked).
The victim runs as `user` through the shim of tests/services/user_pilot.py (qemu:///session:
no privilege), the agent as root, as on a site.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devkit.devcluster import DevCluster
from plugins.slurm.images import read_image_list, write_image_list
from vjob.pilot_files import PilotDir, PilotState, PilotStatus

REPO = Path(__file__).resolve().parents[1]
OVERHEAD_MIB = 256
"""`[provisioning] vm_overhead_mib`'s default: the job asks the guest's memory plus this."""

FILLER = """#!/bin/bash
#VJOB os=debian12
python3 - <<'PY'
import time, zlib
n = {fill}
buf = bytearray(n << 20)
for i in range(n):
    buf[i << 20:(i + 1) << 20] = (i + 1).to_bytes(8, "little") * (1 << 17)
print(f"filled {{n}} {{zlib.crc32(buf)}}", flush=True)
for step in range({ticks}):
    time.sleep(1)
    print(f"tick {{step}}", flush=True)
print(f"check {{n}} {{zlib.crc32(buf)}}", flush=True)
PY
"""
"""The victim's script: fills `fill` MiB of its guest's memory with distinct non-zero pages
(QEMU's save skips only zero pages), prints their CRC, ticks, and prints the CRC again at the
end: equal CRCs after a checkpoint mean the memory came back intact."""


@dataclass
class Outcome:
    """One preemption, as measured."""

    mode: str
    guest_mib: int
    interactive_start_s: float
    """From launching `srun` to its command running."""
    paused_to_saved_s: float | None
    save_seconds: float
    save_bytes: int
    started_before_saved: bool
    """The interactive job ran before the victim's state was whole on disk."""
    victim: str
    reasons: tuple[str, ...] = ()
    """What vjob told the interactive job while it waited."""


class PauseRun:
    """A one-node cluster in `cluster` (up already), a site directory `site` (user_pilot.prepare
    made it), and the agent's configuration per mode."""

    def __init__(self, cluster: DevCluster, site: Path, bindir: Path, user: str, work: Path) -> None:
        self.cluster = cluster
        self.site = site
        self.bindir = bindir
        self.user = pwd.getpwnam(user)
        self.work = work
        self.agent: subprocess.Popen[bytes] | None = None
        self.outputs: dict[str, Path] = {}
        self.reasons: list[str] = []
        """What vjob told the last interactive job while it waited (its AdminComment groups)."""

    # -- set-up ---------------------------------------------------------------------------------
    def agent_config(self, pause_first: bool) -> Path:
        conf = self.work / f"agent-{'pause' if pause_first else 'save'}.toml"
        conf.write_text(
            f'data_dir = "{self.site / "data"}"\n'
            f'[database]\nurl = "sqlite:///{self.work / "agent.sqlite"}"\n'
            f'[agent]\nrms = "slurm"\ninterval_s = 1.0\npilot_dir = "{self.site / "pilots"}"\n'
            f"pause_first = {'true' if pause_first else 'false'}\n"
            "[priority]\ninteractive_cap = 1.0\n"
            f'[slurm]\nconf = "{self.cluster.conf}"\n'
        )
        return conf

    def images(self) -> None:
        """debian12 in the list job_submit.lua accepts."""
        names = read_image_list(self.cluster.image_list) if self.cluster.image_list.exists() else []
        if "debian12" not in names:
            write_image_list(self.cluster.image_list, [*names, "debian12"])
            time.sleep(2.5)  # job_submit.lua caches the list for 2 s

    def start_agent(self, pause_first: bool) -> None:
        conf = self.agent_config(pause_first)
        env = {**os.environ, **self.cluster.env, "VJOB_CONFIG": str(conf)}
        subprocess.run(
            [sys.executable, "-m", "vjob.cli", "--config", str(conf), "db", "upgrade"],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        log = open(self.work / "agent.log", "ab")
        self.agent = subprocess.Popen(
            [sys.executable, "-m", "vjob.cli", "--config", str(conf), "agent", "--rms", "slurm"],
            env=env,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=REPO,
        )
        log.close()

    def stop_agent(self) -> None:
        if self.agent is None:
            return
        self.agent.send_signal(signal.SIGTERM)
        try:
            self.agent.wait(30)
        except subprocess.TimeoutExpired:
            self.agent.kill()
            self.agent.wait(10)
        self.agent = None

    # -- the jobs -------------------------------------------------------------------------------
    def _user_env(self) -> dict[str, str]:
        return {
            **self.cluster.env,
            "HOME": self.user.pw_dir,
            "PATH": f"{self.bindir}:/usr/bin:/bin",
            "VJOB_CONFIG": str(self.site / "vjob.toml"),
        }

    def _as_user(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        env = self._user_env()
        return subprocess.run(
            ["runuser", "-u", self.user.pw_name, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            **kw,
        )

    def submit_victim(self, guest_mib: int, fill_mib: int, ticks: int) -> str:
        jobdir = self.work / f"victim-{guest_mib}-{time.monotonic_ns()}"
        jobdir.mkdir()
        (jobdir / "job.sh").write_text(FILLER.format(fill=fill_mib, ticks=ticks))
        for p in (jobdir, jobdir / "job.sh"):
            os.chown(p, self.user.pw_uid, self.user.pw_gid)
        res = self._as_user(
            ["sbatch", "--parsable", "--requeue", "-N1", "-c4", f"--mem={guest_mib + OVERHEAD_MIB}M", "job.sh"],
            cwd=jobdir,
        )
        if res.returncode != 0:
            raise RuntimeError(f"sbatch: {res.stderr.strip()}")
        job = res.stdout.strip().split(";")[0]
        self.outputs[job] = jobdir / f"slurm-{job}.out"
        return job

    def output(self, job: str) -> str:
        try:
            return self.outputs[job].read_text(errors="replace")
        except OSError:
            return ""

    def pilot(self, job: str) -> PilotStatus | None:
        pdir = PilotDir(self.site / "pilots", "slurm", job)
        try:
            return pdir.read_state()
        except Exception:  # noqa: BLE001 - a half-written file is "not yet"
            return None

    def interactive(self, mem_mib: int, nodes: int = 1) -> float:
        """`srun` as the user, asking every CPU of `nodes` nodes; seconds from its launch to its
        command running. Meanwhile the reasons vjob gave it (its AdminComment) are collected
        into `self.reasons`."""
        env = self._user_env()
        argv = ["srun", f"-N{nodes}", "-c4", f"--mem={mem_mib}M", "-t", "2", "date", "+%s.%N"]
        t0 = time.time()
        proc = subprocess.Popen(
            ["runuser", "-u", self.user.pw_name, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.reasons = []
        while proc.poll() is None:
            listed = subprocess.run(
                ["squeue", "-h", "-t", "PD", "-u", self.user.pw_name, "-O", "admin_comment:400"],
                env={**os.environ, **self.cluster.env},
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
            found = re.findall(r"\[(vjob: [^\]]*)\]", listed)
            self.reasons += [r for r in found if r not in self.reasons]
            time.sleep(0.2)
        out, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"srun: {err.strip()[-500:]}")
        return float(out.strip().splitlines()[-1]) - t0

    def state(self, job: str) -> str:
        out = subprocess.run(
            ["scontrol", "show", "job", job],
            env={**os.environ, **self.cluster.env},
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        m = re.search(r"JobState=(\S+)", out)
        return m.group(1) if m else ""

    def cancel(self, job: str) -> None:
        subprocess.run(["scancel", job], env={**os.environ, **self.cluster.env}, timeout=30, check=False)

    # -- one measurement ------------------------------------------------------------------------
    def preempt_once(
        self, mode: str, guest_mib: int, *, ticks: int, boot_timeout_s: float = 900, mem_mib: int = 512
    ) -> Outcome:
        """The victim filled, the interactive job run; the victim left requeue-held (the caller
        cancels it or lets the agent release it)."""
        victim = self.submit_victim(guest_mib, int(guest_mib * 0.8), ticks)
        _wait(lambda: "filled" in self.output(victim), boot_timeout_s, f"victim {victim} to fill its memory")
        return self.preempt(mode, victim, guest_mib, mem_mib=mem_mib)

    def preempt(self, mode: str, victim: str, guest_mib: int, *, nodes: int = 1, mem_mib: int = 512) -> Outcome:
        """The user's interactive job on `nodes` nodes (every CPU of each) against the running
        `victim`: timed, and the victim's save waited for."""
        started_at = time.time()
        start_s = self.interactive(mem_mib, nodes)
        ran_at = started_at + start_s
        seen: list[PilotStatus] = []

        def saved() -> bool:
            st = self.pilot(victim)
            if st is not None and st.state is PilotState.SAVED:
                seen.append(st)
            return bool(seen)

        _wait(saved, 600, f"victim {victim}'s save")
        st = seen[0]
        saved_at = _entered(st, "saved")
        paused_at = _entered(st, "saving")
        return Outcome(
            mode=mode,
            guest_mib=guest_mib,
            interactive_start_s=round(start_s, 3),
            paused_to_saved_s=round(saved_at - paused_at, 3) if saved_at and paused_at else None,
            save_seconds=round(st.save_seconds, 3),
            save_bytes=st.save_bytes,
            started_before_saved=bool(saved_at and ran_at < saved_at),
            victim=victim,
            reasons=tuple(self.reasons),
        )


def _entered(st: PilotStatus, state: str) -> float | None:
    """When the pilot last entered `state` (its history)."""
    times = [float(h["at"]) for h in st.history if h.get("state") == state]
    if st.state.value == state:
        times.append(st.since)
    return max(times) if times else None


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def clean_user_vms(user: str) -> None:
    """Delete the user's vjob VMs (session libvirt) and their files: a bench's victims were
    cancelled with their state on disk (best effort; the dev cluster's lock is held)."""
    pw = pwd.getpwnam(user)
    env = {"HOME": pw.pw_dir, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    virsh = ["runuser", "-u", user, "--", "virsh", "-c", "qemu:///session"]
    names = subprocess.run(
        [*virsh, "list", "--all", "--name"], capture_output=True, text=True, timeout=30, env=env
    ).stdout.split()
    for name in [n for n in names if n.startswith("vjob-slurm-")]:
        for verb in ("destroy", "undefine"):
            subprocess.run([*virsh, verb, name], capture_output=True, timeout=30, env=env)
    base = Path(pw.pw_dir) / ".local" / "share" / "vjob"
    for sub in ("vms", "snapshots"):
        for path in (base / sub).glob("vjob-slurm-*"):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


__all__ = ["FILLER", "Outcome", "PauseRun", "clean_user_vms"]
