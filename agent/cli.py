"""`vjob agent --rms slurm`: the agent loop (agent.loop), with its Prometheus exporter."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from agent.loop import Agent
from agent.metrics import AgentMetrics
from plugins import make_adapter
from vjob import log
from vjob.cli import load_config
from vjob.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("agent", help="run the vjob agent next to the RMS controller (observe, decide, act)")
    p.add_argument("--rms", choices=("slurm", "pbs", "oar"), help="the resource manager (default: [agent] rms)")
    p.add_argument("--once", action="store_true", help="one tick (after recovering open switches), then exit")
    p.add_argument("--interval", type=float, metavar="S", help="seconds between ticks (default: [agent] interval_s)")
    p.add_argument("--metrics-port", type=int, metavar="PORT", help="Prometheus port (default: [agent] metrics_port)")
    p.set_defaults(func=_agent)


def _agent(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    rms = args.rms or cfg.agent.rms
    if rms == "sim":
        raise UsageError("vjob agent: --rms sim has no live resource manager; use `vjob simulate`")
    if args.interval is not None:
        if args.interval <= 0:
            raise UsageError(f"--interval {args.interval}: must be > 0")
        cfg.agent.interval_s = args.interval
    port = cfg.agent.metrics_port if args.metrics_port is None else args.metrics_port
    metrics = AgentMetrics()
    if port:
        metrics.serve(port)
    agent = Agent(cfg, make_adapter(rms, cfg), rms=rms, metrics=metrics)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.get("agent").info("agent started", rms=rms, interval_s=cfg.agent.interval_s, metrics_port=port)
    agent.run(stop, once=args.once)
    log.get("agent").info("agent stopped", rms=rms)
    return 0
