"""`deploy/devcluster up|status|down|env`: the development cluster's command line (devkit.devcluster).

Why apart: the cluster's module holds what `up` and `down` do; this one only parses and prints.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devkit.devcluster import CTLD_PORT, DEFAULT_DIR, ENV_DIR, ENV_PORT, DevCluster, Settings
from vjob.errors import UsageError, VjobError


def main(argv: Sequence[str] | None = None) -> int:
    """`deploy/devcluster up|status|down|env`; a VjobError is one line on stderr and its exit code."""
    parser = argparse.ArgumentParser(prog="deploy/devcluster", description="The Slurm development cluster of vjob.")
    parser.add_argument("--dir", type=Path, default=None, help=f"run directory (default ${ENV_DIR} or {DEFAULT_DIR})")
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="start everything (idempotent); returns when all is ready")
    up.add_argument("--nodes", type=int, default=8)
    up.add_argument(
        "--port", type=int, default=None, help=f"slurmctld port (default ${ENV_PORT} or {CTLD_PORT}; step 10)"
    )
    up.add_argument("--cpus", type=int, default=4, help="CPUs per node")
    up.add_argument("--memory-mb", type=int, default=4096, help="memory per node")
    up.add_argument("--agent", choices=("auto", "yes", "no"), default="auto", help="start `vjob agent --rms slurm`")
    up.add_argument("--no-libvirt", action="store_true", help="do not start virtlogd/libvirtd")
    up.add_argument(
        "--hosts", type=int, default=1, help="split the nodes over this many network-namespace hosts (1: this machine)"
    )
    st = sub.add_parser("status", help="say what runs (exit 0 when the cluster is up, 1 otherwise)")
    st.add_argument("--json", action="store_true")
    down = sub.add_parser("down", help="stop what `up` started, by pid (idempotent)")
    down.add_argument("--keep-state", action="store_true", help="keep Slurm's saved jobs for the next `up`")
    sub.add_parser("env", help="print the environment (SLURM_CONF, VJOB_CONFIG) as shell exports")
    args = parser.parse_args(argv)
    cluster = DevCluster(args.dir)

    def say(message: str) -> None:
        """Progress on stderr: stdout holds only the command's answer."""
        print(f"devcluster: {message}", file=sys.stderr, flush=True)

    try:
        if args.action == "up":
            if os.geteuid() != 0:
                raise UsageError("deploy/devcluster up: must run as root (munged, slurmd and libvirtd need it)")
            settings = Settings(
                run_dir=cluster.root,
                nodes=args.nodes,
                cpus=args.cpus,
                memory_mb=args.memory_mb,
                agent=args.agent,
                libvirt=not args.no_libvirt,
                hosts=args.hosts,
                **({"port": args.port} if args.port is not None else {}),
            )
            result = cluster.up(settings, progress=say)
            say(f"up in {result['timings']['total_s']:.2f} s; use: source {cluster.etc / 'env'}")
            print(json.dumps({"devcluster": "up", "run_dir": result["run_dir"], **result["timings"]}))
            return 0
        if args.action == "status":
            status = cluster.status()
            if args.json:
                print(json.dumps(status, indent=1))
            else:
                _print_status(status)
            return 0 if status["up"] else 1
        if args.action == "down":
            cluster.down(keep_state=args.keep_state, progress=say)
            say("down")
            return 0
        for key, value in cluster.env.items():
            print(f"export {key}={value}")
        return 0
    except VjobError as exc:
        print(f"devcluster: {exc}", file=sys.stderr)
        return exc.exit_code


def _print_status(status: dict[str, Any]) -> None:
    """`status` without --json: one component a line."""
    print(f"run dir    {status['run_dir']}")
    print(f"munged     {'running' if status['munged'] else 'not running'}")
    print(f"slurmctld  {'running' if status['slurmctld'] else 'not running'}")
    print(f"slurmdbd   {'running' if status['slurmdbd'] else 'not running'}")
    print(f"mariadb    {'running' if status['mariadb'] else 'not running'}")
    for node, alive in status["slurmd"].items():
        print(f"slurmd     {node:<8} {'running' if alive else 'not running':<12} {status['nodes'].get(node, '-')}")
    print(f"libvirtd   {status['libvirt']}")
    for host, what in status.get("hosts", {}).items():
        print(f"host       {host:<8} {what} (own libvirtd, sshd, node service)")
    print(f"agent      {status['agent']}")
    print(f"cluster    {'UP' if status['up'] else 'DOWN'}")


if __name__ == "__main__":
    sys.exit(main())
