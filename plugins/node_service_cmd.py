"""`vjob node-service`: the root-side service on each compute node (provisioning.node_service),
with the RMS's job authority (plugins.node_authority), under systemd or not.

Why the checks here: the service must run as root (it makes bridges and exports) and only as
root, and a node whose RMS cannot be asked, or whose operations do not load, should fail at
start with one line, not refuse every pilot later.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from provisioning.node_service.operations import Sweep, registry, sweepers
from vjob.cli import load_config
from vjob.errors import UsageError

if TYPE_CHECKING:
    from vjob.config import Config

# The service itself (the RMS's authority, the server, pydantic, structlog) is imported by
# _node_service when it runs, so that `vjob node-service --help` loads none of it (issue 36).

EPILOG = """\
examples:
  vjob node-service                          the daemon, as the systemd unit runs it
  vjob node-service --once-check             check the configuration, the operations and the RMS, then exit
  vjob node-service --socket /tmp/n.sock --names node1,node2

Pilots (ordinary users) ask it through [node] socket; docs/security.md ("The node service")
says who may ask what, docs/operator.md how to run it."""

WATCHDOG_EVERY_S = 10.0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "node-service",
        help="the root-side service on each compute node (bridges, NFS gateway, usage) for job pilots",
        description="Listen on a Unix socket for requests of job pilots; each is checked against the peer's uid "
        "(SO_PEERCRED) and the RMS's record of the job (running, the caller's, on this node) before it acts. "
        "Runs as root.",
        epilog=EPILOG,
    )
    p.add_argument(
        "--rms", choices=("slurm", "oar", "pbs"), help="whose record says a job runs here (default: [node] rms)"
    )
    p.add_argument("--socket", metavar="PATH", help="socket path (default: [node] socket, else /run/vjob/node.sock)")
    p.add_argument(
        "--names", metavar="N1,N2", help="node names served (default: [node] names, else the short host name)"
    )
    p.add_argument(
        "--once-check", action="store_true", help="load everything, ask the RMS once, print a JSON summary, exit"
    )
    p.set_defaults(func=_node_service)


def served_names(cfg: Config, given: str | None) -> frozenset[str]:
    if given:
        names = [n.strip() for n in given.split(",") if n.strip()]
        try:
            cfg.node.names = names  # validated as the file's would be
        except ValueError as exc:
            raise UsageError(f"--names {given[:80]!r}: {str(exc).splitlines()[-1]}") from None
    return frozenset(cfg.node.names or [socket.gethostname().split(".")[0]])


def _node_service(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:  # before loading anything: an ordinary user gets this line, nothing else
        raise UsageError("vjob node-service: must run as root (it makes bridges, taps and exports for jobs)")
    from plugins.node_authority import authority  # heavy: pydantic
    from plugins.usage_writers import usage_writer  # heavy: pydantic
    from provisioning.node_service import site, usage_ops  # heavy: pydantic
    from provisioning.node_service.config import DEFAULT_SOCKET  # heavy: pydantic
    from provisioning.node_service.server import Limits, NodeService  # heavy: structlog
    from provisioning.node_service.tunnel import install_addresses  # heavy: sqlalchemy
    from vjob import log  # heavy: structlog
    from vjob.sdnotify import Notifier  # heavy: structlog

    cfg = load_config(args)
    rms = args.rms or cfg.node.rms
    path = args.socket or cfg.node.socket or DEFAULT_SOCKET
    names = served_names(cfg, args.names)
    site.install(cfg)
    usage_ops.install_writer(usage_writer(rms, cfg))
    operations = registry()
    judge = authority(rms, cfg)
    install_addresses(getattr(judge, "node_addresses", None))  # the far ends of jobs' tunnels
    if args.once_check:
        print(
            json.dumps(
                {
                    "rms": rms,
                    "socket": path,
                    "names": sorted(names),
                    "operations": sorted(operations),
                    "rms_answers": _probe(judge, names),
                }
            )
        )
        return 0
    limits = Limits(
        max_connections=cfg.node.max_connections,
        max_connections_per_user=cfg.node.max_connections_per_user,
        requests_per_minute_per_user=cfg.node.requests_per_minute_per_user,
        read_deadline_s=cfg.node.read_deadline_s,
        operation_deadline_s=cfg.node.operation_deadline_s,
    )
    service = NodeService(path, operations, judge, names, limits)
    service.bind()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    notify = Notifier()
    last = [0.0]

    def tick() -> None:
        if time.monotonic() - last[0] >= WATCHDOG_EVERY_S:
            last[0] = time.monotonic()
            notify.watchdog()

    logger = log.get("node-service")
    logger.info("node service started", rms=rms, socket=path, names=sorted(names), operations=sorted(operations))
    notify.ready(f"vjob node service for {rms} on {path}")
    if cfg.node.sweep_interval_s > 0:
        args_ = (sweepers(), judge, stop, cfg.node.sweep_interval_s)
        threading.Thread(target=_sweep_loop, args=args_, name="sweep", daemon=True).start()
    try:
        service.serve(stop, tick)
    finally:
        notify.stopping()
        service.close()
    logger.info("node service stopped")
    return 0


def _sweep_loop(sweeps: list[tuple[str, Sweep]], judge: Any, stop: threading.Event, every_s: float) -> None:
    """Every sweep at start, then every `every_s` ([node] sweep_interval_s) until the service
    stops; one that fails (the RMS unreachable, a command's error) is logged and tried again next
    time."""
    from vjob import log  # heavy: structlog

    logger = log.get("node-service")
    while not stop.is_set():
        for name, sweep in sweeps:
            try:
                sweep(judge)
            except Exception as exc:  # noqa: BLE001 - a reaper never stops the service
                logger.warning("sweep failed", module=name, error=f"{type(exc).__name__}: {str(exc)[:300]}")
        stop.wait(every_s)


def _probe(judge: Any, names: frozenset[str]) -> bool:
    """Ask the RMS about a job id no RMS gives out (a failure to ask raises, naming the command)."""
    judge.grant("4294967294", sorted(names)[0])
    return True
