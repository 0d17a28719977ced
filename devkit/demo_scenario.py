"""The Slurm end-to-end scenario: batch vjobs fill the cluster, an interactive job arrives.

Why one scenario for the demo (`deploy/demo`), the benchmark (`bench/e2e_slurm.py`) and the
end-to-end tests: all three must run the very same steps, so that the figures the README
quotes are the ones the tests check. The steps:

1. batch vjobs (`sbatch -N2 --exclusive`) fill the development cluster. With a real image
   (`image="debian12"`, the demo's default) they are ordinary batch scripts — a deterministic
   Python computation that prints progress and writes `result.txt` in its working directory,
   saying only `#VJOB os=debian12`; job_submit.lua wraps them (devkit.demo_jobs). With the
   counter guest (`image="debian-tiny"`, the tests' and benchmark's default) each runs `vjob run`;
2. once every guest counts, an interactive job (`srun` without a batch script) asks for
   nodes that are all busy;
3. with the agent running, it checkpoints the lowest-priority victims and requeue-holds them,
   the interactive job starts; when it ends the victims are released and resume (locally:
   Slurm gives them back their nodes), their counters continuing where they stopped. Real
   jobs then run to their end: each `result.txt` must equal that of the same program run
   uninterrupted on the host (`outputs_identical`), and each output file must hold every
   progress line once, in order.

Without the agent (`Scenario(agent=False)`, Slurm alone) the interactive job waits for
batch jobs to end, which is the baseline of the benchmark. The demo measures that baseline in
its own run instead (devkit.demo_outcome.no_preemption_wait: the batch jobs' remaining run
time), and its real jobs size their work from their start latency (REAL_MIN_S), so that it
passes on a busy machine as on a quiet one; `Outcome.problems` lists the claims a run failed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devkit.demo_jobs import REAL_STEPS, TINY_IMAGE, progress_steps, real_script, uninterrupted_result
from devkit.demo_outcome import Outcome, Timeline, no_preemption_wait, remaining_run_s, victim_work
from devkit.devcluster import JOB_SUBMIT_LUA
from devkit.guest_probe import guest_panic, last_counter
from plugins.slurm.images import read_image_list, write_image_list
from provisioning.driver import Driver
from provisioning.images import node_os
from vjob.config import load
from vjob.errors import VjobError
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, vms_of
from vjob.store import jobs as store_jobs
from vjob.store import snapshots as store_snapshots
from vjob.store.db import Store

VJOB = Path(sys.executable).with_name("vjob")


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
        image: str = TINY_IMAGE,
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
        self.image = image
        self.real = image != TINY_IMAGE
        self.config = self.work / "vjob.toml"
        self.data = self.work / "data"
        self.agent_proc: subprocess.Popen[bytes] | None = None
        self.jobs: list[str] = []
        self.submitted_at = 0.0
        """When the batch jobs were submitted (time.time()): the real jobs size their work from it."""
        self.timeline = Timeline()

    # -- set-up ---------------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """Also the jobs' environment (sbatch exports it): the wrapper finds `vjob` on PATH."""
        path = f"{VJOB.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        return {**os.environ, **self.cluster.env, "VJOB_CONFIG": str(self.config), "PATH": path}

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
            "checkpoint_timeout_s = 120.0\n"
            "[priority]\n"
            "interactive_cap = 0.5\n"
            "[slurm]\n"
            f'conf = "{self.cluster.conf}"\n'
            "[logging]\n"
            'format = "json"\n'
        )
        self._vjob("db", "upgrade")
        if self.real:
            self.prepare_image()

    def prepare_image(self) -> None:
        """The real image in this run's catalogue (from the build cache: ~5 s; the first build
        on a machine ~50 s), the cluster's job_submit.lua current and the image in its list."""
        t0 = time.monotonic()
        self._vjob("image", "build", self.image, timeout_s=1800)
        self.say(f"image {self.image} in the catalogue ({time.monotonic() - t0:.1f} s)")
        lua = self.cluster.etc / "job_submit.lua"
        if lua.read_text() != JOB_SUBMIT_LUA.read_text():
            shutil.copyfile(JOB_SUBMIT_LUA, lua)  # slurmctld reloads a changed script by itself
        listing = self.cluster.image_list
        names = read_image_list(listing) if listing.exists() else []
        if self.image not in names:
            write_image_list(listing, [*names, self.image])
            time.sleep(2.5)  # job_submit.lua caches the list for 2 s

    def _vjob(self, *args: str, timeout_s: float = 120) -> str:
        """A `vjob` command on this run's configuration; its output, or VjobError with its stderr's end."""
        cmd = [str(VJOB) if VJOB.exists() else sys.executable, *([] if VJOB.exists() else ["-m", "vjob.cli"])]
        res = subprocess.run(
            [*cmd, "--config", str(self.config), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if res.returncode != 0:
            raise VjobError(f"vjob {' '.join(args)} failed: {res.stderr.strip()[-500:]}")
        return res.stdout

    def start_agent(self) -> None:
        """`vjob agent --rms slurm` in its own session, logging to agent.log in the work dir."""
        cmd = [str(VJOB) if VJOB.exists() else sys.executable, *([] if VJOB.exists() else ["-m", "vjob.cli"])]
        log = open(self.work / "agent.log", "ab")
        self.agent_proc = subprocess.Popen(
            [*cmd, "--config", str(self.config), "agent", "--rms", "slurm"],
            env=self.env,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()

    def stop_agent(self, sig: int | None = None) -> None:
        """Stop the agent with `sig` (SIGTERM by default), killing it if it has not ended in 30 s."""
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
        """The counter guest's batch script: `vjob run`, one VM per node, counting for `batch_seconds` if set."""
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
            # A VM per node, as a real image gets: the counter guest is one VM unless --nodes says so.
            'nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)\n'
            f'exec {vjob} --config {self.config} run --memory {self.memory_mib} --nodes "$nodes"{payload}\n'
        )

    def job_dir(self, i: int) -> Path:
        """A real job's working directory (its result.txt lands there)."""
        return self.work / f"job{i}"

    def seed(self, i: int) -> str:
        """The real job `i`'s input: each job computes its own chain, checked against the same run uninterrupted."""
        return f"vjob-demo-{i}"

    def submit_batch(self) -> list[str]:
        """`sbatch` every batch job (requeueable, exclusive, output appended); their Slurm job ids."""
        out_dir = self.work / "out"
        out_dir.mkdir(exist_ok=True)
        self.submitted_at = time.time()
        for i in range(self.batch_jobs):
            if self.real:
                script = real_script(self.image, self.seed(i), submitted_at=self.submitted_at)
            else:
                script = self.batch_script()
            extra: list[str] = []
            if self.real:
                self.job_dir(i).mkdir(exist_ok=True)
                extra = [f"--chdir={self.job_dir(i)}"]
            res = subprocess.run(
                [
                    "sbatch",
                    "--parsable",
                    "-N",
                    str(self.nodes_per_batch),
                    "--exclusive",
                    "-J",
                    f"vjob-batch-{i}",
                    "-o",
                    str(out_dir / "%j.out"),
                    "--open-mode=append",
                    "--requeue",
                    *extra,
                ],
                input=script,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            if res.returncode != 0:
                raise VjobError(f"sbatch failed: {res.stderr.strip()}")
            self.jobs.append(res.stdout.strip().split(";")[0])
        self.say(f"submitted {len(self.jobs)} batch vjobs: {', '.join(self.jobs)}")
        return self.jobs

    def pilot(self, job: str) -> PilotStatus | None:
        """The state file of the job's pilot, None until the pilot wrote one."""
        try:
            return PilotDir(self.data / "pilots", "slurm", job).read_state()
        except VjobError:
            return None

    def wait_guests_counting(self, timeout_s: float = 900.0, at_least: int = 3) -> None:
        """Until every batch guest has counted `at_least` (a real job: its progress steps). The
        timeout is generous because it is only reached when something is broken: guests took
        155-235 s to boot at load 12 under TCG (issue 32)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = {j: self.pilot(j) for j in self.jobs}
            if panicked := [p for st in states.values() if st and (p := guest_panic(st))]:
                raise VjobError(f"{panicked[0]} ({self._describe()})")
            if failed := [j for j, st in states.items() if st and st.state is PilotState.FAILED]:
                raise VjobError(f"the pilot of batch job {failed[0]} failed: {self._describe()}")
            if ended := [j for j, st in states.items() if st and st.state is PilotState.FINISHED]:
                raise VjobError(
                    f"batch job {ended[0]} ended before every guest was up (the interactive job would find free "
                    f"nodes): {self._describe()}"
                )
            ready = [
                j
                for j, st in states.items()
                if st and st.state is PilotState.RUNNING and self.progress(j, st) >= at_least
            ]
            if len(ready) == len(self.jobs):
                self.say(f"all {len(ready)} guests are counting")
                return
            time.sleep(0.5)
        raise VjobError(f"guests not all counting after {timeout_s:.0f} s: {self._describe()}")

    def progress(self, job: str, st: PilotStatus) -> int:
        """How far the job got: the guest's last counter, or a real job's last progress step."""
        if not self.real:
            return last_counter(Path(st.console_log)) or 0
        steps = progress_steps(self.work / "out" / f"{job}.out")
        return steps[-1] if steps else 0

    def _describe(self) -> str:
        """Every job's pilot state, message and last console line: what an error message shows."""
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
            said = f" {st.message[:200]!r}" if st is not None and st.message else ""
            parts.append(f"{j}:{st.state.value if st else 'no pilot'}{said}{tail}")
        return ", ".join(parts)

    def run_interactive(self, timeout_s: float = 600.0) -> float:
        """`srun` on busy nodes; returns seconds from submission to its start on the nodes."""
        t0 = time.time()
        self.timeline.t0 = t0
        self.timeline.add(t0, f"interactive job submitted: srun -N{self.interactive_nodes}")
        try:
            proc = subprocess.run(
                [
                    "srun",
                    "-N",
                    str(self.interactive_nodes),
                    "--exclusive",
                    "-J",
                    "vjob-interactive",
                    "/bin/date",
                    "+%s.%N",
                ],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise VjobError(
                f"the interactive job did not start within {timeout_s:.0f} s (victims so far: "
                f"{', '.join(self.victims()) or 'none'}; see {self.work / 'agent.log'})"
            ) from None
        if proc.returncode != 0:
            raise VjobError(f"srun failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
        started = min(float(x) for x in proc.stdout.split())
        self.timeline.add(started, "interactive job started on its nodes")
        self.say(f"interactive job started {started - t0:.2f} s after submission")
        return started - t0

    def wait_resumed(self, victims: list[str], timeout_s: float = 600.0) -> list[str]:
        """The victims whose VM was restored (a real job may have ended since), waiting at most
        `timeout_s`; a shorter list when some did not come back."""
        deadline = time.monotonic() + timeout_s
        resumed: list[str] = []
        while time.monotonic() < deadline:
            done = (PilotState.RUNNING, PilotState.FINISHED) if self.real else (PilotState.RUNNING,)
            resumed = [
                v for v in victims if (st := self.pilot(v)) is not None and st.state in done and st.restores >= 1
            ]
            if len(resumed) == len(victims):
                return resumed
            time.sleep(0.5)
        return resumed

    def _listed(self) -> list[str] | None:
        """The batch jobs Slurm still lists (None when squeue failed: not known to be gone)."""
        res = subprocess.run(
            ["squeue", "-h", "-o", "%i", "-j", ",".join(self.jobs)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return res.stdout.split() if res.returncode == 0 else None

    def wait_finished(self, timeout_s: float | None = None) -> None:
        """Until Slurm no longer lists any of the batch jobs (the real jobs ran to their end).
        By default it waits 600 s or four times what the jobs have run so far, whichever is
        longer: a real job spreads its work over 1.5 x its start latency (REAL_MIN_S)."""
        if timeout_s is None:
            timeout_s = max(600.0, 4 * (time.time() - self.submitted_at)) if self.submitted_at else 600.0
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._listed() == []:
                return
            time.sleep(1.0)
        raise VjobError(f"batch jobs not finished after {timeout_s:.0f} s: {self._describe()}")

    def check_outputs(self) -> dict[str, str]:
        """Per job, what differs from an uninterrupted run ("" when nothing does)."""
        problems: dict[str, str] = {}
        for i, job in enumerate(self.jobs):
            want = uninterrupted_result(self.seed(i), self.work / "reference" / str(i))
            result = self.job_dir(i) / "result.txt"
            steps = progress_steps(self.work / "out" / f"{job}.out")
            if not result.exists():
                problems[job] = "no result.txt"
            elif result.read_text() != want:
                problems[job] = f"result.txt {result.read_text().strip()[:16]}… != {want.strip()[:16]}…"
            elif steps != list(range(1, REAL_STEPS + 1)):
                problems[job] = f"output holds progress steps {steps[:5]}…{steps[-5:]}, not 1..{REAL_STEPS} once"
            else:
                problems[job] = ""
        return problems

    def victims(self) -> list[str]:
        """Jobs whose VM was saved after the interactive job arrived (the agent's victims)."""
        return [
            j
            for j in self.jobs
            if (st := self.pilot(j)) is not None
            and any(h["state"] == "saved" and h["at"] >= self.timeline.t0 for h in st.history)
        ]

    def outcome(self, interactive_s: float, victims: list[str], resumed: list[str]) -> Outcome:
        """The run's figures: the victims' events, work and records, the no-preemption wait (real jobs)."""
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
                lost_here, pair = victim_work(st, self.work / "out" / f"{v}.out" if self.real else None)
                lost += lost_here
                if pair is not None:
                    counter_pairs[v] = pair
                rec = store_jobs.get(store, "slurm", v)
                pn[v] = rec.preempt_count if rec else 0
                ckpt[v] = st.save_seconds
            # What the agent recorded from the pilots (issue 15 items 5 and 6).
            saved = {r.job for r in store_snapshots.listing(store, rms="slurm") if r.job in victims}
            nodes = set(self.cluster.node_names())
            carrying = sum(1 for node, image in node_os(store).items() if image == self.image and node in nodes)
        finally:
            store.close()
        local = sum(1 for v in resumed if (st := self.pilot(v)) is not None and st.local_restores >= 1)
        wait = None
        if self.real:
            ends = [remaining_run_s(st.history, self.timeline.t0) if (st := self.pilot(j)) else None for j in self.jobs]
            wait = no_preemption_wait(ends, self.victims_needed)
            if wait is not None:
                self.timeline.add(self.timeline.t0 + wait, "interactive job's start without preemption (measured)")
        return Outcome(
            interactive_s,
            victims,
            resumed,
            local,
            lost,
            counter_pairs,
            pn,
            ckpt,
            self.timeline,
            image=self.image,
            snapshots_in_store=len(saved),
            nodes_with_image=carrying,
            no_preemption_wait_s=wait,
            victims_needed=self.victims_needed,
        )

    @property
    def victims_needed(self) -> int:
        """Batch jobs that must make room for the interactive job on the full cluster."""
        return -(-self.interactive_nodes // self.nodes_per_batch)

    # -- tear-down ------------------------------------------------------------------------
    def cleanup(self) -> None:
        """Stop the agent, cancel this run's jobs, and delete their VMs and saved states."""
        self.stop_agent()
        if self.jobs:
            subprocess.run(["scancel", *self.jobs], env=self.env, capture_output=True, timeout=30, check=False)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if not self._listed():
                    break
                time.sleep(0.5)
        cfg = load(self.config)
        driver = Driver(cfg.provisioning, data_dir=cfg.data_path)
        try:
            for j in self.jobs:
                st = self.pilot(j)
                for vm, node in vms_of(st) if st is not None else []:  # a multi-node vjob: each VM
                    driver.delete(vm, node)
        finally:
            driver.close()
