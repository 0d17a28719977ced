"""What telling held-back interactive users why costs the agent per tick, on the dev cluster.

Why count calls rather than time them: the claim in docs/slurm-agent.md ("Why is my
interactive job waiting?") is that a reason is written only when it changed, so a steady queue
costs no `scontrol` call; that is a count, exact on any machine. The seconds of the notice step
are printed beside it for scale (they vary with the load of the two shared cores).

N interactive `srun`s of `nobody` (`--n 5,20,40`) wait behind one batch job that holds every
node. An agent with the default cap ticks three times (the first writes every reason, the next
two are steady), then a second agent whose cap is 0 ticks twice (every reason changes, then is
steady). Each tick's Slurm calls are counted at the adapter: `scontrol show job` (the read
before a write) and `scontrol update ... AdminComment=` (the write), apart from the tick's other
calls. Run as root under the dev cluster's lock:

    flock /tmp/vjob-devcluster.lock nice -n 10 .venv/bin/python bench/wait_notice_ticks.py --n 5,20,40

Starts the dev cluster if it is not up (and stops it again), cancels what it submitted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.loop import Agent
from devkit.devcluster import DevCluster, Settings
from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import SlurmCommands
from vjob.config import Config, parse
from vjob.store.db import Store

NAME = "vjob-bench-wait"


class CountingCommands(SlurmCommands):
    """Slurm's commands, each call remembered (program and arguments) for the tick's count."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[tuple[str, list[str]]] = []

    def run(self, name: str, args: Sequence[str], **kwargs: Any) -> str:  # type: ignore[override]
        self.calls.append((name, list(args)))
        return super().run(name, args, **kwargs)


def _config(base: Path, cluster: DevCluster, cap: float) -> Config:
    cfg = parse(
        {
            "data_dir": str(base),
            "slurm": {"conf": str(cluster.conf)},
            "scheduling": {"policy": "vjob"},
            "priority": {"interactive_cap": cap},
        }
    )
    cfg.data_path.mkdir(parents=True)
    Store(cfg.database_url).upgrade()
    return cfg


def _tick(agent: Agent, cmds: CountingCommands, label: str) -> dict[str, Any]:
    """One tick; its calls sorted into notice reads, notice writes and the rest."""
    spent = [0.0]
    update = agent.notices.update

    def timed(*args: Any, **kwargs: Any) -> None:
        t0 = time.perf_counter()
        update(*args, **kwargs)
        spent[0] += time.perf_counter() - t0

    agent.notices.update = timed  # type: ignore[method-assign]
    cmds.calls.clear()
    try:
        result = agent.tick()
    finally:
        agent.notices.update = update  # type: ignore[method-assign]
    reads = sum(1 for p, a in cmds.calls if p == "scontrol" and a[:1] == ["show"])
    writes = sum(1 for p, a in cmds.calls if p == "scontrol" and any(x.startswith("AdminComment=") for x in a))
    return {
        "tick": label,
        "held_back": len(result.decision.waits),
        "notice_reads": reads,
        "notice_writes": writes,
        "other_calls": len(cmds.calls) - reads - writes,
        "notice_step_s": round(spent[0], 4),
        "errors": len(result.errors),
    }


def measure(cluster: DevCluster, n: int) -> list[dict[str, Any]]:
    env = cluster.env
    user_env = {"PATH": "/usr/bin:/bin", **env}

    def run(*args: str) -> str:
        return subprocess.run(list(args), env=env, capture_output=True, text=True, check=True, timeout=30).stdout

    cmds = CountingCommands(conf=str(cluster.conf), timeout_s=20)
    adapter = SlurmAdapter(cmds)
    base = Path(tempfile.mkdtemp(prefix="vjob-bench-wait-"))
    nodes = run("sinfo", "-h", "-o", "%D").strip()
    wrap = ("--wrap", "sleep 600")
    batch = run("sbatch", "--parsable", "--exclusive", f"-N{nodes}", "-t", "10", "--output=/dev/null", *wrap).strip()
    sruns: list[subprocess.Popen[bytes]] = []
    try:
        while "RUNNING" not in run("squeue", "-h", "-j", batch, "-o", "%T"):
            time.sleep(0.3)
        srun = ("srun", "-J", NAME, "-N1", "--exclusive", "-t", "1", "--chdir=/tmp", "/bin/true")
        for _ in range(n):
            sruns.append(
                subprocess.Popen(
                    ["/usr/sbin/runuser", "-u", "nobody", "--", *srun],
                    env=user_env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        while len(run("squeue", "-h", "-n", NAME, "-o", "%i").split()) < n:
            time.sleep(0.3)
        first = Agent(_config(base / "a", cluster, 0.5), adapter, rms="slurm")
        rows = [_tick(first, cmds, label) for label in ("first", "steady", "steady")]
        capped = Agent(_config(base / "b", cluster, 0.0), adapter, rms="slurm")
        rows += [_tick(capped, cmds, label) for label in ("all changed (cap 0)", "steady")]
        return [{"n": n, **row} for row in rows]
    finally:
        subprocess.run(["scancel", batch], env=env, check=False)
        subprocess.run(["scancel", "-n", NAME], env=env, check=False)
        for p in sruns:
            p.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", default="5,20,40", help="numbers of held-back sruns, comma separated")
    args = parser.parse_args()
    cluster = DevCluster()
    started = not cluster.is_up()
    if started:
        cluster.up(Settings(run_dir=cluster.root, agent="no", libvirt=False))
    try:
        for n in (int(x) for x in args.n.split(",")):
            for row in measure(cluster, n):
                print(json.dumps(row))
    finally:
        if started:
            cluster.down()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
