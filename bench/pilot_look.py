"""The agent's look at the pilots' directories at a site's size, tick by tick (issue 37 item 1).

What is timed is what the agent does for the pilots each tick (agent.observe.observe's part):
the pilot root listed (agent.pilot_dirs), the jobs' users mapped (pilot_users), and every
directory heard (read_pilots: agent.pilot_hear.hear with the agent's memo: the owner check, the
state file's look, its claim). The directories are made like bench/agent_tick.py's (one per
running batch vjob, a RUNNING state written by the pilot's own atomic rename), here owned by
this machine's accounts in turn (as root); between ticks `--churn` pilots write a new state and
as many new directories appear.

The clock is simulated (`--interval` seconds a tick, a site's `interval_s`; the CPU is real),
so the ticks show when the owner checks come due. Measured in the same run: the rule before,
each directory's check made again OWNER_CACHE_S after the last (all were made in the first
tick, so all came due together), and the rule now (a user's uid asked again at the user's own
phase of OWNER_CACHE_S, the directories checked again only when it changed); per tick the CPU,
the owner checks and the uid look-ups. The peer: two lstat per directory and nothing else, the
floor of a look that repeats both checks at every tick.

Run it `nice -n 19`. Last line: one JSON object.
Usage: PYTHONPATH=. nice -n 19 .venv/bin/python bench/pilot_look.py [--dirs 19000] [--ticks 19]
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agent import observe, pilot_hear
from agent.heap_pace import HeapPace
from agent.pilot_dirs import pilot_dirs
from vjob.pilot_files import PilotDir, PilotState, PilotStatus

T0 = 1_795_300_000


class Clock:
    """time.monotonic for the agent's modules: the ticks' simulated time (the CPU is real)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _write(root: Path, job_id: int, state: PilotState, owner: tuple[int, int] | None) -> None:
    """The pilot's state write (an atomic rename), in a directory `owner` (uid, gid) owns."""
    pdir = PilotDir(root, "slurm", str(job_id))
    pdir.path.mkdir(parents=True, exist_ok=True)
    status = PilotStatus(job_id=str(job_id), vm=pdir.vm, node="n00001", uri="qemu:///system", state=state, since=T0)
    pdir.write_state(status)
    if owner is not None:
        os.chown(pdir.path, *owner)
        os.chown(pdir.state_file, *owner)


class Counted:
    """A function of pilot_hear's, called through and counted (which slow paths each tick took)."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.fn(*args, **kwargs)


def _floor(root: Path) -> float:
    """CPU seconds of two lstat per directory of the root, as paths: the peer."""
    paths = [str(d.path) for d in pilot_dirs(root, "slurm")]
    t0 = time.process_time()
    for path in paths:
        os.lstat(path)
        os.lstat(f"{path}/state.json")
    return time.process_time() - t0


def _ports(root: Path) -> Any:
    """What agent.observe.read_pilots and pilot_users use of the agent's ports."""
    quiet = SimpleNamespace(warning=lambda *a, **k: None)
    errors = SimpleNamespace(labels=lambda **k: SimpleNamespace(inc=lambda: None))
    return SimpleNamespace(root=root, rms="slurm", log=quiet, metrics=SimpleNamespace(errors=errors), pilot_dirs={})


def _ticks(
    args: argparse.Namespace, root: Path, users: list[Any], first_new: int, *, former: bool
) -> list[dict[str, Any]]:
    """The agent's pilot look (agent.observe.observe's: the root listed, the users mapped, the
    directories heard) at each simulated tick, with the owner checks and uid look-ups in each.
    `former`: every directory's owner check made again every OWNER_CACHE_S since the first tick
    (the rule before: each check expired OWNER_CACHE_S after it was made), its uid asked anew."""
    jobs = {str(j): SimpleNamespace(user=users[j % len(users)].pw_name) for j in range(1, first_new)}
    ports = _ports(root)
    observe._MEMOS.pop(root, None)  # a new agent
    clock = Clock()
    pilot_hear.time.monotonic = clock  # type: ignore[attr-defined]  # the owner checks' clock, simulated
    spread = pilot_hear._due
    if former:
        pilot_hear._due = lambda _user, now: now + pilot_hear.OWNER_CACHE_S
    checks, lookups = Counted(pilot_hear._check_owner), Counted(pwd.getpwnam)
    pilot_hear._check_owner, pilot_hear.pwd = checks, SimpleNamespace(getpwnam=lookups)  # type: ignore[assignment]
    heap = HeapPace(thaw_every=10**9)  # frozen as the agent's daemon does at each tick (agent.heap_pace)
    next_id, ticks = first_new, []
    try:
        for n in range(args.ticks + 1):
            for j in range(next_id, next_id + args.churn):  # the RMS lists the jobs about to start
                jobs[str(j)] = SimpleNamespace(user=users[j % len(users)].pw_name)
            if former and n and (clock.now - 1000.0) % pilot_hear.OWNER_CACHE_S == 0:
                observe._MEMOS[root].users.clear()  # each check due: every directory checked afresh
            heap.tick_starts()
            checks.calls = lookups.calls = 0
            t0 = time.process_time()
            dirs = pilot_dirs(root, "slurm")
            pilots = observe.read_pilots(ports, dirs, observe.pilot_users(ports, dirs, jobs), max_vms=10_000)
            cpu = time.process_time() - t0
            assert len(pilots) == len(dirs), (len(pilots), len(dirs))
            ticks.append(
                {
                    "at_s": clock.now - 1000.0,
                    "cpu_s": round(cpu, 4),
                    "owner_checks": checks.calls,
                    "uid_lookups": lookups.calls,
                }
            )
            for job_id in range(n * args.churn + 1, (n + 1) * args.churn + 1):  # pilots that moved on
                _write(root, job_id, PilotState.FINISHED, _owner_of(users, job_id))
            for _ in range(args.churn):  # and new ones
                _write(root, next_id, PilotState.RUNNING, _owner_of(users, next_id))
                next_id += 1
            clock.now += args.interval
    finally:
        pilot_hear._due, pilot_hear._check_owner, pilot_hear.pwd = spread, checks.fn, pwd  # type: ignore[assignment]
    return ticks


def _owner_of(users: list[Any], job_id: int) -> tuple[int, int] | None:
    """The job's user's (uid, gid) to own its directory; None when not root (the runner's own)."""
    user = users[job_id % len(users)]
    return (user.pw_uid, user.pw_gid) if os.geteuid() == 0 else None


def _summary(ticks: list[dict[str, Any]]) -> dict[str, Any]:
    steady = [t["cpu_s"] for t in ticks[1:]]
    return {
        "first_tick_cpu_s": ticks[0]["cpu_s"],
        "steady_cpu_s": round(statistics.median(steady), 4),
        "steady_max_cpu_s": max(steady),
        "steady_min_cpu_s": min(steady),
        "owner_checks_max": max(t["owner_checks"] for t in ticks[1:]),
        "owner_checks_median": statistics.median(t["owner_checks"] for t in ticks[1:]),
        "uid_lookups_max": max(t["uid_lookups"] for t in ticks[1:]),
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    # The jobs' users: this machine's accounts, each owning its jobs' directories (as root; the
    # runner alone otherwise).
    users = sorted(pwd.getpwall(), key=lambda p: p.pw_name) if os.geteuid() == 0 else [pwd.getpwuid(os.geteuid())]
    roots = {}
    for former in (True, False):
        root = roots[former] = work / ("former" if former else "pilots")
        for job_id in range(1, args.dirs + 1):
            _write(root, job_id, PilotState.RUNNING, _owner_of(users, job_id))
    former = _ticks(args, roots[True], users, args.dirs + 1, former=True)
    ticks = _ticks(args, roots[False], users, args.dirs + 1, former=False)
    floor = statistics.median(_floor(roots[False]) for _ in range(3))
    out = {
        "bench": "pilot_look",
        "dirs": args.dirs,
        "users": len(users),
        "churn": args.churn,
        "interval_s": args.interval,
        "owner_cache_s": pilot_hear.OWNER_CACHE_S,
        **_summary(ticks),
        "floor_two_lstat_cpu_s": round(floor, 4),
        "former_expiry": _summary(former),
    }
    out["steady_over_floor"] = round(out["steady_cpu_s"] / floor, 3)
    out["former_max_over_max"] = round(out["former_expiry"]["steady_max_cpu_s"] / out["steady_max_cpu_s"], 3)
    out["ticks"] = [(t["at_s"], t["cpu_s"], t["owner_checks"], t["uid_lookups"]) for t in ticks]
    out["former_ticks"] = [(t["at_s"], t["cpu_s"], t["owner_checks"], t["uid_lookups"]) for t in former]
    out["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dirs", type=int, default=19_000, help="pilot directories (running batch vjobs)")
    parser.add_argument("--ticks", type=int, default=19, help="steady ticks after the first")
    parser.add_argument("--churn", type=int, default=20, help="states rewritten and directories added per tick (each)")
    parser.add_argument("--interval", type=float, default=10.0, help="simulated seconds between ticks")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vjob-pilot-look-"))
    try:
        out = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
