"""`vjob drain`: take vjob out of the RMS's way, and `vjob drain --undo` to bring it back.

Why the command may drain by itself: the mark is in the store (agent.drain), and a running agent
acts on it at its next tick (woken at once through `<data_dir>/agent.wake`); but an operator may
drain because the agent is stopped, or about to be removed (`vjob uninstall --force`). When no
agent holds the cluster's lease, the command takes it for one tick of its own, which is the
drained agent's tick (release, reset, clear), then gives it back. Either way it returns when an
agent — the running one or itself — has finished a pass that left nothing to undo, or exits 1
at `--timeout` saying what it waited for.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from plugins import make_adapter
from vjob.cli import load_config
from vjob.errors import UsageError, VjobError

EPILOG = """\
examples:
  vjob drain                  stop preempting; release every checkpointed job; put the RMS's own
                              priorities back; remove vjob's wait notes; wait until it is done
  vjob drain --no-wait        mark the cluster drained and return (the agent acts at its next tick)
  vjob drain --undo           preempt and order again
  vjob status                 shows "drained since ... by ..." while it lasts

A drained agent keeps running: running vjobs run to their end, finished ones are cleaned up.
The mark is in the state store, so a restarted agent (or the standby of an HA pair) stays
drained until `vjob drain --undo`. Exit 0 when drained (or undrained), 1 when no agent finished
a drain pass within --timeout, 2 on bad usage."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "drain",
        help="stop preempting, release checkpointed jobs, reset priorities (--undo: back to normal)",
        description="Mark the cluster drained in the state store and wait until an agent (the running one, "
        "or this command when none runs) has released every job vjob checkpointed, put the RMS's own "
        "priority back on every job and removed vjob's wait notes.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rms", choices=("slurm", "pbs", "oar"), help="the resource manager (default: [agent] rms)")
    p.add_argument("--undo", action="store_true", help="undrain: the agent preempts and orders jobs again")
    p.add_argument("--no-wait", action="store_true", help="mark and return, without waiting for the agent")
    p.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="how long to wait for a finished drain pass (default: 3 agent intervals, at least 60 s)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    p.set_defaults(func=_drain)


@dataclass
class DrainOutcome:
    """What `vjob drain` reports."""

    rms: str
    drained_by: str
    since: float
    done_by: str = ""
    """The agent that finished the pass: the running agent's owner, or this command's."""
    released: list[str] = field(default_factory=list)
    priorities_reset: int = 0
    notes_cleared: list[str] = field(default_factory=list)


def _drain(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    rms = args.rms or cfg.agent.rms
    if rms == "sim":
        raise UsageError("vjob drain: --rms sim has no live resource manager")
    if args.timeout is not None and not 0 < args.timeout <= 86400:
        raise UsageError(f"--timeout {args.timeout}: must be in (0, 86400] seconds")
    if args.undo:
        return _undo(cfg, rms, args.json)
    timeout = args.timeout if args.timeout is not None else max(60.0, 3 * cfg.agent.interval_s)
    outcome = drain(cfg, rms, wait=not args.no_wait, timeout_s=timeout)
    if args.json:
        print(json.dumps(outcome.__dict__, sort_keys=True))
        return 0
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(outcome.since))
    print(f"drained {rms} (since {since}, by {outcome.drained_by})")
    if outcome.done_by:
        print(f"drain pass finished by {outcome.done_by}")
    if outcome.released:
        print(f"released: {' '.join(outcome.released)}")
    if outcome.priorities_reset:
        print(f"priorities set back to the RMS's own: {outcome.priorities_reset} jobs")
    if outcome.notes_cleared:
        print(f"wait notes removed: {' '.join(outcome.notes_cleared)}")
    return 0


def drain(cfg: Any, rms: str, *, wait: bool = True, timeout_s: float = 60.0) -> DrainOutcome:
    """Mark `rms` drained and (with `wait`) see a pass finished; VjobError at the timeout."""
    from agent import drain as drain_state  # heavy: sqlalchemy
    from agent.loop import Agent, wake_file  # heavy: numba
    from vjob.store import leases  # heavy: sqlalchemy
    from vjob.store.db import open_store  # heavy: sqlalchemy

    store = open_store(cfg)
    agents = contextlib.ExitStack()  # the command's own agent, if it ticks: closed on the way out
    try:
        mark = drain_state.mark(store, rms, f"{getpass.getuser()}@{socket.gethostname()}")
        outcome = DrainOutcome(rms, mark.by, mark.since)
        _wake(wake_file(cfg))
        if not wait:
            return outcome
        deadline = time.monotonic() + timeout_s
        agent = None
        while True:
            done = drain_state.read_mark(store, drain_state.done_name(rms))
            if done is not None and done.since >= mark.since:
                outcome.done_by = outcome.done_by or done.by
                return outcome
            holder = leases.holder(store, f"agent:{rms}")
            if holder is None:  # no agent acts: this command's own tick is the drain pass
                if agent is None:
                    owner = f"vjob-drain@{socket.gethostname()}:{os.getpid()}"
                    agent = agents.enter_context(Agent(cfg, make_adapter(rms, cfg), rms=rms, owner=owner))
                try:
                    report = agent.tick()
                finally:
                    agent.ports.lease.give_up()
                outcome.released += [j for j in report.released if j not in outcome.released]
                last = agent.drain.last
                if last is not None:
                    outcome.priorities_reset += len(last.reset)
                    outcome.notes_cleared += last.cleared
                outcome.done_by = owner if report.active else ""
                if report.errors:
                    print(f"vjob: warning: drain pass: {'; '.join(report.errors)[:500]}", file=sys.stderr)
            if time.monotonic() >= deadline:
                who = f"agent {holder}" if holder else "this command's own pass"
                raise VjobError(
                    f"{rms} is marked drained, but {who} did not finish a drain pass within {timeout_s:.0f} s "
                    "(a switch still waiting for a save? an RMS command failing? see the agent's log); "
                    "run `vjob drain` again to wait more"
                )
            time.sleep(0.5)
    finally:
        agents.close()
        store.close()


def _undo(cfg: Any, rms: str, as_json: bool) -> int:
    from agent import drain as drain_state  # heavy: sqlalchemy
    from agent.loop import wake_file  # heavy: numba
    from vjob.store.db import open_store  # heavy: sqlalchemy

    store = open_store(cfg)
    try:
        was = drain_state.unmark(store, rms)
    finally:
        store.close()
    _wake(wake_file(cfg))
    if as_json:
        print(json.dumps({"rms": rms, "undrained": was}))
    else:
        print(f"undrained {rms}" if was else f"{rms} was not drained")
    return 0


def _wake(path: Any) -> None:
    """Touch the agent's wake file so a running agent ticks now (a missing data_dir: nobody runs)."""
    try:
        path.touch(exist_ok=True)
        os.utime(path)
    except OSError:
        pass


__all__ = ["DrainOutcome", "drain", "register"]
