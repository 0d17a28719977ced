"""Subcommands of this package (registered by vjob.cli): `vjob plan`.

Why a command for the planner alone: an operator (or a test, or a bug report) can replay any
context switch offline from its instance JSON, compare the optimisers, and check a plan
produced elsewhere, without a cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from preemption.planner import Instance, Plan, make_plan, validate
from vjob.cli import load_config
from vjob.errors import InputError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="plan a cluster-wide context switch (Entropy) for an instance JSON",
        description="Print the cheapest viable plan taking the instance's VMs to their target states.",
    )
    p.add_argument("instance", metavar="INSTANCE.json", help="the instance (docs/planner.md); - for stdin")
    p.add_argument("--optimizer", choices=["cpsat", "ffd"], help="placement optimiser (default: [planner] optimizer)")
    p.add_argument("--time-limit", type=float, metavar="S", help="CP-SAT time limit in seconds")
    p.add_argument("--format", choices=["json", "text"], default="json", help="output format (default json)")
    p.add_argument("--check", metavar="PLAN.json", help="validate this plan against the instance instead of planning")
    p.set_defaults(func=_plan)


def _read_json(path: str, what: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot read ({exc.strerror})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{what} {path}: not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None


def _plan(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    inst = Instance.from_dict(_read_json(args.instance, "instance"), source=args.instance)
    if args.check:
        plan = Plan.from_dict(_read_json(args.check, "plan"), source=args.check)
        validate(inst, plan)
        print(f"plan {args.check} is valid for {args.instance}: cost {plan.cost}, {len(plan.pools)} pool(s)")
        return 0
    time_limit = args.time_limit if args.time_limit is not None else cfg.planner.time_limit_s
    if not time_limit > 0:
        raise InputError(f"--time-limit = {time_limit}: must be > 0 seconds")
    plan = make_plan(inst, optimizer=args.optimizer or cfg.planner.optimizer, time_limit_s=time_limit)
    if args.format == "json":
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(plan.to_text())
    return 0
