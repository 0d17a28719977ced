"""The Slurm end-to-end scenario: batch vjobs fill the cluster, an interactive job arrives.

Why one module for the demo (`deploy/demo`), the benchmark (`bench/e2e_slurm.py`) and the
end-to-end tests: all three must run the very same scenario, so that the figures the README
quotes are the ones the tests check. The steps:

1. batch vjobs (`sbatch -N2 --exclusive`, each runs `vjob run`: the tiny counter guest)
   fill the development cluster;
2. once every guest counts, an interactive job (`srun` without a batch script) asks for
   nodes that are all busy;
3. with the agent running, it checkpoints the lowest-priority victims and requeue-holds them,
   the interactive job starts; when it ends the victims are released and resume (locally:
   Slurm gives them back their nodes), their counters continuing where they stopped.

Without the agent (`Scenario(agent=False)`, Slurm alone) the interactive job waits for
batch jobs to end, which is the baseline of the benchmark.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devkit.devcluster import DevCluster, Settings
from devkit.guest_probe import boots, counters, last_counter
from provisioning.driver import Driver
from vjob import log
from vjob.config import load
from vjob.errors import VjobError
from vjob.pilot_files import PilotDir, PilotState, PilotStatus
from vjob.store import jobs as store_jobs
from vjob.store.db import Store

REPO = Path(__file__).resolve().parents[1]
VJOB = Path(sys.executable).with_name("vjob")


@dataclass
class Timeline:
    """Events of one run, seconds since the interactive job was submitted."""

    t0: float = 0.0
    events: list[tuple[float, str]] = field(default_factory=list)

    def add(self, at: float, text: str) -> None:
        self.events.append((at - self.t0, text))

    def lines(self) -> list[str]:
        return [f"{t:+8.2f} s  {text}" for t, text in sorted(self.events)]


@dataclass
class Outcome:
    interactive_start_s: float
    victims: list[str]
    resumed: list[str]
    local_resumes: int
    work_lost_s: float
    counters: dict[str, tuple[int, int]]
    """Victim → (last counter before its checkpoint, first counter after its resume)."""
    preempt_counts: dict[str, int]
    checkpoint_seconds: dict[str, float]
    timeline: Timeline

    def json_line(self) -> dict[str, Any]:
        return {
            "demo": "slurm",
            "interactive_start_s": round(self.interactive_start_s, 2),
            "victims": len(self.victims),
            "resumed": len(self.resumed),
            "work_lost_s": round(self.work_lost_s, 2),
        }


class Scenario:
    """One run of the scenario on a running development cluster (devkit.devcluster)."""

    def __init__(
        self,
        cluster: Any,
        work: Path,
        *,
        batch_jobs: int = 4,
        nodes_per_batch: int = 2,
        interactive_nodes: int = 4,
        memory_mib: int = 128,
        agent: bool = True,
        batch_seconds: int | None = None,
        say: Callable[[str], None] = lambda _m: None,
    ) -> None:
        self.cluster = cluster
        self.work = Path(work)
        self.batch_jobs = batch_jobs
        self.nodes_per_batch = nodes_per_batch
        self.interactive_nodes = interactive_nodes
        self.memory_mib = memory_mib
        self.use_agent = agent
        self.batch_seconds = batch_seconds
        self.say = say
        self.config = self.work / "vjob.toml"
        self.data = self.work / "data"
        self.agent_proc: subprocess.Popen[bytes] | None = None
        self.jobs: list[str] = []
        self.timeline = Timeline()

    # -- set-up ---------------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **self.cluster.env, "VJOB_CONFIG": str(self.config)}

    def prepare(self) -> None:
        """Write this run's configuration and create its store (SQLite, in the work dir)."""
        self.work.mkdir(parents=True, exist_ok=True)
        self.work.chmod(0o711)  # QEMU runs as libvirt-qemu and must reach the VM disks below
        self.config.write_text(
            "# written by devkit.demo\n"
            f'data_dir = "{self.data}"\n'
            "[agent]\n"
            'rms = "slurm"\n'
            "interval_s = 1.0\n"
            "checkpoint_timeout_s = 60.0\n"
            "[priority]\n"
            "interactive_cap = 0.5\n"
            "[slurm]\n"
            f'conf = "{self.cluster.conf}"\n'
            "[logging]\n"
            'format = "json"\n'
        )
        self._vjob("db", "upgrade")

    def _vjob(self, *args: str) -> str:
        cmd = [str(VJOB) if VJOB.exists() else sys.executable, *([] if VJOB.exists() else ["-m", "vjob.cli"])]
        res = subprocess.run([*cmd, "--config", str(self.config), *args], env=self.env, capture_output=True,
                             text=True, timeout=120, check=False)  # fmt: skip
        if res.returncode != 0:
            raise VjobError(f"vjob {' '.join(args)} failed: {res.stderr.strip()[-500:]}")
        return res.stdout

    def start_agent(self) -> None:
        cmd = [str(VJOB) if VJOB.exists() else sys.executable, *([] if VJOB.exists() else ["-m", "vjob.cli"])]
        log = open(self.work / "agent.log", "ab")
        self.agent_proc = subprocess.Popen(
            [*cmd, "--config", str(self.config), "agent", "--rms", "slurm"],
            env=self.env, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        log.close()

    def stop_agent(self, sig: int | None = None) -> None:
        import signal

        if self.agent_proc is None:
            return
        if self.agent_proc.poll() is None:
            self.agent_proc.send_signal(sig or signal.SIGTERM)
            try:
                self.agent_proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.agent_proc.kill()
                self.agent_proc.wait(timeout=10)
        self.agent_proc = None

    # -- steps ----------------------------------------------------------------------------
    def batch_script(self) -> str:
        payload = ""
        if self.batch_seconds is not None:
            work = self.work / "payload.sh"
            work.write_text(
                f'i=0\nwhile [ $i -lt {self.batch_seconds} ]; do i=$((i+1)); echo "COUNTER $i"; sleep 1; done\n'
            )
            payload = f" --payload {work}"
        vjob = VJOB if VJOB.exists() else f"{sys.executable} -m vjob.cli"
        return (
            "#!/bin/bash\n"
            "#VJOB os=debian-tiny\n"
            f"exec {vjob} --config {self.config} run --memory {self.memory_mib}{payload}\n"
        )

    def submit_batch(self) -> list[str]:
        out_dir = self.work / "out"
        out_dir.mkdir(exist_ok=True)
        for i in range(self.batch_jobs):
            res = subprocess.run(
                ["sbatch", "--parsable", "-N", str(self.nodes_per_batch), "--exclusive", "-J", f"vjob-batch-{i}",
                 "-o", str(out_dir / "%j.out"), "--open-mode=append", "--requeue"],
                input=self.batch_script(), env=self.env, capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            if res.returncode != 0:
                raise VjobError(f"sbatch failed: {res.stderr.strip()}")
            self.jobs.append(res.stdout.strip().split(";")[0])
        self.say(f"submitted {len(self.jobs)} batch vjobs: {', '.join(self.jobs)}")
        return self.jobs

    def pilot(self, job: str) -> PilotStatus | None:
        try:
            return PilotDir(self.data / "pilots", "slurm", job).read_state()
        except VjobError:
            return None

    def wait_guests_counting(self, timeout_s: float = 480.0, at_least: int = 3) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = {j: self.pilot(j) for j in self.jobs}
            if any(st and st.state in (PilotState.FAILED, PilotState.FINISHED) for st in states.values()):
                raise VjobError(f"a pilot failed or its guest ended early: {self._describe()}")
            ready = [
                j for j, st in states.items()
                if st and st.state is PilotState.RUNNING and (last_counter(Path(st.console_log)) or 0) >= at_least
            ]  # fmt: skip
            if len(ready) == len(self.jobs):
                self.say(f"all {len(ready)} guests are counting")
                return
            time.sleep(0.5)
        raise VjobError(f"guests not all counting after {timeout_s:.0f} s: {self._describe()}")

    def _describe(self) -> str:
        parts = []
        for j in self.jobs:
            st = self.pilot(j)
            tail = ""
            if st is not None and st.console_log:
                try:
                    lines = Path(st.console_log).read_text(errors="replace").strip().splitlines()
                    tail = f" (console: {lines[-1][-120:]!r})" if lines else " (console empty)"
                except OSError as exc:
                    tail = f" (console unreadable: {exc.strerror})"
            parts.append(f"{j}:{st.state.value if st else 'no pilot'}{tail}")
        return ", ".join(parts)

    def run_interactive(self, timeout_s: float = 300.0) -> float:
        """`srun` on busy nodes; returns seconds from submission to its start on the nodes."""
        t0 = time.time()
        self.timeline.t0 = t0
        self.timeline.add(t0, f"interactive job submitted: srun -N{self.interactive_nodes}")
        proc = subprocess.run(
            ["srun", "-N", str(self.interactive_nodes), "--exclusive", "-J", "vjob-interactive",
             "/bin/date", "+%s.%N"],
            env=self.env, capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise VjobError(f"srun failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
        started = min(float(x) for x in proc.stdout.split())
        self.timeline.add(started, "interactive job started on its nodes")
        self.say(f"interactive job started {started - t0:.2f} s after submission")
        return started - t0

    def wait_resumed(self, victims: list[str], timeout_s: float = 240.0) -> list[str]:
        deadline = time.monotonic() + timeout_s
        resumed: list[str] = []
        while time.monotonic() < deadline:
            resumed = [
                v for v in victims
                if (st := self.pilot(v)) is not None and st.state is PilotState.RUNNING and st.restores >= 1
            ]  # fmt: skip
            if len(resumed) == len(victims):
                return resumed
            time.sleep(0.5)
        return resumed

    def victims(self) -> list[str]:
        """Jobs whose VM was saved after the interactive job arrived (the agent's victims)."""
        return [
            j for j in self.jobs
            if (st := self.pilot(j)) is not None
            and any(h["state"] == "saved" and h["at"] >= self.timeline.t0 for h in st.history)
        ]  # fmt: skip

    def outcome(self, interactive_s: float, victims: list[str], resumed: list[str]) -> Outcome:
        store = Store(f"sqlite:///{self.data / 'vjob.sqlite'}")
        counter_pairs: dict[str, tuple[int, int]] = {}
        lost = 0.0
        pn: dict[str, int] = {}
        ckpt: dict[str, float] = {}
        try:
            for v in victims:
                st = self.pilot(v)
                assert st is not None
                for h in st.history:
                    if h["at"] >= self.timeline.t0 and h["state"] in ("saved", "running"):
                        what = "checkpointed" if h["state"] == "saved" else "resumed"
                        self.timeline.add(h["at"], f"job {v} {what} on {h['node']}")
                before, after = split_counters(Path(st.console_log), st.console_bytes_at_save)
                if before and after:
                    counter_pairs[v] = (before[-1], after[0])
                    # Counters the guest prints twice were computed twice: work lost.
                    lost += max(0, before[-1] + 1 - after[0])
                if boots(Path(st.console_log)) > 1:
                    lost += float(before[-1]) if before else 0.0
                rec = store_jobs.get(store, "slurm", v)
                pn[v] = rec.preempt_count if rec else 0
                ckpt[v] = st.save_seconds
        finally:
            store.close()
        local = sum(1 for v in resumed if (st := self.pilot(v)) is not None and st.local_restores >= 1)
        return Outcome(interactive_s, victims, resumed, local, lost, counter_pairs, pn, ckpt, self.timeline)

    # -- tear-down ------------------------------------------------------------------------
    def cleanup(self) -> None:
        """Stop the agent, cancel this run's jobs, and delete their VMs and saved states."""
        self.stop_agent()
        if self.jobs:
            subprocess.run(["scancel", *self.jobs], env=self.env, capture_output=True, timeout=30, check=False)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                res = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(self.jobs)], env=self.env,
                                     capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
                if not res.stdout.split():
                    break
                time.sleep(0.5)
        cfg = load(self.config)
        driver = Driver(cfg.provisioning, data_dir=cfg.data_path)
        try:
            for j in self.jobs:
                st = self.pilot(j)
                if st is not None:
                    driver.delete(st.vm, st.node)
        finally:
            driver.close()


def split_counters(console_log: Path, offset: int) -> tuple[list[int], list[int]]:
    """The guest's counters printed before byte `offset` of its console log, and after."""
    seq = counters(console_log)
    printed_before = console_log.read_bytes()[:offset].count(b"COUNTER ") if seq else 0
    return seq[:printed_before], seq[printed_before:]


def run_demo(work: Path, *, keep_cluster: bool = False, plot: Path | None = None) -> Outcome:
    """The README's main command: cluster up, scenario, timeline, cluster down (if we started it)."""
    from rich.console import Console

    console = Console(stderr=True)
    log.configure("warning", "console", sys.stderr)
    cluster = DevCluster()
    started_here = not cluster.is_up()
    if started_here:
        with console.status("bringing up the development cluster (munge, slurmctld, 8 slurmd, libvirtd)"):
            cluster.up(Settings(run_dir=cluster.root, agent="no"), progress=lambda m: console.log(m))
    sc = Scenario(cluster, work, say=lambda m: console.log(m))
    try:
        sc.prepare()
        sc.start_agent()
        sc.submit_batch()
        with console.status("booting the batch vjobs' guests (QEMU, software emulation)"):
            sc.wait_guests_counting()
        with console.status(f"interactive job: srun -N{sc.interactive_nodes} on a full cluster"):
            started = sc.run_interactive()
        victims = sc.victims()
        with console.status(f"waiting for the victims {', '.join(victims)} to resume"):
            resumed = sc.wait_resumed(victims)
            time.sleep(3)
        out = sc.outcome(started, victims, resumed)
    finally:
        sc.cleanup()
        if started_here and not keep_cluster:
            with console.status("taking the development cluster down"):
                cluster.down()
    print("timeline (seconds from the interactive job's submission):")
    for line in out.timeline.lines():
        print(f"  {line}")
    for v in out.victims:
        before, after = out.counters.get(v, (0, 0))
        print(
            f"  job {v}: guest counter {before} before its checkpoint, {after} after its resume; "
            f"checkpoint {out.checkpoint_seconds.get(v, 0):.2f} s; Pn = {out.preempt_counts.get(v, 0)}"
        )
    print(f"  {out.local_resumes} of {len(out.resumed)} resumes were local (on the node of their checkpoint)")
    if plot is not None:
        plot_timeline(out, plot)
        print(f"  timeline plot: {plot}")
    return out


def plot_timeline(out: Outcome, path: Path) -> None:
    """A PNG of the timeline: one row per event, seconds on the x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = sorted(out.timeline.events)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(events) + 1.2))
    for row, (t, text) in enumerate(events):
        ax.plot([t], [row], "o", color="tab:red" if "checkpoint" in text else "tab:blue")
        ax.annotate(text, (t, row), xytext=(6, -3), textcoords="offset points", fontsize=8)
    ax.set_yticks([])
    ax.set_xlabel("seconds since the interactive job was submitted")
    ax.set_title("vjob on Slurm: interactive job preempts batch vjobs by VM checkpoint")
    ax.set_xlim(min(t for t, _ in events) - 2, max(t for t, _ in events) * 1.6 + 5)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import tempfile

    p = argparse.ArgumentParser(prog="deploy/demo", description="vjob on Slurm, end to end")
    p.add_argument("--work", type=Path, help="working directory (default: a new temporary one)")
    p.add_argument("--keep-cluster", action="store_true", help="leave a cluster this demo started running")
    p.add_argument("--plot", type=Path, default=REPO / "out" / "demo_timeline.png")
    args = p.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="vjob-demo-", dir="/var/tmp"))
    out = run_demo(work, keep_cluster=args.keep_cluster, plot=args.plot)
    print(json.dumps(out.json_line()))
    return 0 if out.victims and len(out.resumed) == len(out.victims) else 1


if __name__ == "__main__":
    sys.exit(main())
