"""`vjob agent`: the agent loop (agent.loop) with its Prometheus exporter, under systemd or not.

Why the checks here: a daemon should fail at start with one line saying what to fix (a missing
extra, a bad option), not a tick later in a log. Under systemd (`Type=notify`, the shipped
unit) it tells the service manager when it is ready (vjob.sdnotify).
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from typing import Any

from plugins import make_adapter
from vjob.cli import load_config, require_extra
from vjob.errors import UsageError

# The agent (numba, SQLAlchemy, the adapters) is imported by _agent when it runs, so that
# `vjob agent --help` loads none of it (issue 36).

EPILOG = """\
examples:
  vjob agent                                 the daemon, as the systemd unit runs it ([agent] rms)
  vjob agent --rms slurm --dry-run --once    one tick: log the priorities, victims and releases it
                                             would send, change nothing (no lease taken)
  vjob agent --metrics-port 9817 --metrics-address 0.0.0.0

Two agents on one cluster (an HA pair of controllers): one holds the store's lease and acts,
the other stands by and takes over [agent] lease_s after the first dies. Units, dashboard and
alert rules: `vjob deploy list`; the whole guide: docs/operator.md."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "agent",
        help="run the vjob agent next to the RMS controller (observe, decide, act)",
        description="Every [agent] interval_s (or at once when an interactive job arrives): observe the RMS, "
        "compute UBIS priorities, checkpoint batch victims for interactive jobs, release them later, "
        "record everything in the state store.",
        epilog=EPILOG,
    )
    p.add_argument("--rms", choices=("slurm", "pbs", "oar"), help="the resource manager (default: [agent] rms)")
    p.add_argument(
        "--once",
        action="store_true",
        help="one tick (after recovering open switches), then exit: 0 when it ran whole, 1 when it failed",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="observe and decide each tick, log what would be done (priorities, victims, releases), change "
        "nothing: no lease, no RMS command that modifies, no checkpoint, no store write",
    )
    p.add_argument(
        "--interval", type=float, metavar="SECONDS", help="seconds between ticks (default: [agent] interval_s)"
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="TCP port of the Prometheus exporter, 0 = none (default: [agent] metrics_port)",
    )
    p.add_argument(
        "--metrics-address",
        metavar="IP",
        help="IP address the exporter listens on (default: [agent] metrics_address, 127.0.0.1)",
    )
    p.set_defaults(func=_agent)


def _has_ortools() -> bool:
    """Whether CP-SAT can be used (only the package's top level is imported: a few ms)."""
    try:
        importlib.import_module("ortools")
    except ImportError:
        return False
    return True


def _agent(args: argparse.Namespace) -> int:
    # AgentMetrics through agent.loop, which imports it anyway (prometheus_client alone is no
    # reason for a function-level import).
    from agent.loop import Agent, AgentMetrics  # heavy: numba
    from vjob import log  # heavy: structlog
    from vjob.sdnotify import Notifier  # heavy: structlog

    cfg = load_config(args)
    rms = args.rms or cfg.agent.rms
    if rms == "sim":
        raise UsageError("vjob agent: --rms sim has no live resource manager; use `vjob simulate`")
    if args.interval is not None:
        if args.interval <= 0:
            raise UsageError(f"--interval {args.interval}: must be > 0 seconds")
        cfg.agent.interval_s = args.interval
    if args.metrics_port is not None:
        if not 0 <= args.metrics_port <= 65535:
            raise UsageError(f"--metrics-port {args.metrics_port}: must be 0..65535")
        cfg.agent.metrics_port = args.metrics_port
    if args.metrics_address is not None:
        try:
            cfg.agent.metrics_address = args.metrics_address
        except ValueError:
            raise UsageError(f"--metrics-address {args.metrics_address[:80]!r}: must be an IP address") from None
    if cfg.planner.optimizer == "cpsat" and not _has_ortools():
        # CP-SAT is the [planner] extra (OR-Tools and pandas, about 170 MB): a base install plans
        # its context switches with first-fit decreasing and says so once, here, not at each plan.
        cfg.planner.optimizer = "ffd"
        log.get("agent").warning(
            "OR-Tools is not installed: context switches are planned with first-fit decreasing",
            fix="pip install 'vjob[planner]' for CP-SAT plans, or set [planner] optimizer = \"ffd\"",
        )
    metrics = AgentMetrics()
    port, address = cfg.agent.metrics_port, cfg.agent.metrics_address
    if port and cfg.agent.metrics_web_config:
        require_extra("vjob agent with [agent] metrics_web_config", "yaml", "bcrypt")
    if port:
        try:
            metrics.serve(port, address, cfg.agent.metrics_web_config)
        except OSError as exc:
            raise UsageError(f"metrics exporter on {address} port {port}: {exc.strerror}") from None
    agent = Agent(cfg, make_adapter(rms, cfg), rms=rms, metrics=metrics, dry_run=args.dry_run)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    notify = Notifier()
    mode = "dry run" if args.dry_run else "active or standby"
    log.get("agent").info(
        "agent started",
        rms=rms,
        mode=mode,
        interval_s=cfg.agent.interval_s,
        metrics=f"{address}:{port}" if port else None,
    )
    notify.ready(f"vjob agent for {rms} ({mode})")
    try:
        whole = agent.run(stop, once=args.once)
    finally:
        notify.stopping()
    log.get("agent").info("agent stopped", rms=rms)
    if args.once and not whole:
        print("vjob: error: the tick did not run whole (its errors are in the log above)", file=sys.stderr)
        return 1
    return 0
