"""Subcommands of this package (registered by vjob.cli): `vjob plan` and `vjob schema`.

Why a command for the planner alone: an operator (or a test, or a bug report) can replay any
context switch offline from its instance JSON, compare the optimisers, and check a plan
produced elsewhere, without a cluster. `vjob schema` prints the JSON Schema of each JSON input
vjob reads, from the pydantic models that validate them (vjob.json_input): it lives here
because this is the lowest layer that knows all three (cluster view, instance, plan).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from vjob.cli import load_config, require_extra
from vjob.errors import InputError

# The planner and the input models (pydantic, numpy) are imported by the commands when they
# run, so that `vjob plan --help` and `vjob schema --help` load neither (issue 36).

PLAN_EPILOG = """\
examples:
  vjob plan instance.json                        the cheapest viable plan, as JSON
  vjob plan --format text --optimizer ffd instance.json
  vjob plan --time-limit 30 instance.json        answer within 30 s (wall clock, everything included)
  vjob plan --start placement.json instance.json start from a known viable placement
  vjob plan --check plan.json instance.json      is this plan viable for this instance?
  vjob schema instance                           the instance format (docs/planner.md)

CP-SAT needs the planner extra (pip install 'vjob[planner]'); --optimizer ffd does not."""

SCHEMA_EPILOG = """\
examples:
  vjob schema clusterview > clusterview.schema.json   what `vjob prio --from` reads
  vjob schema instance                                what `vjob plan` reads
  vjob schema plan                                    what `vjob plan` prints and --check reads"""

SCHEMAS = ("clusterview", "instance", "plan")
"""The inputs `vjob schema` describes (their models are imported when it runs)."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="plan a cluster-wide context switch (Entropy) for an instance JSON",
        description="Print the cheapest viable plan taking the instance's VMs to their target states: pools "
        "of actions run in parallel, every intermediate configuration within the nodes' CPU and memory.",
        epilog=PLAN_EPILOG,
    )
    p.add_argument("instance", metavar="INSTANCE.json", help="the instance (`vjob schema instance`); - for stdin")
    p.add_argument(
        "--optimizer",
        choices=["cpsat", "ffd"],
        help="placement optimiser: cpsat (OR-Tools, least cost) or ffd (first-fit decreasing) "
        "(default: [planner] optimizer)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        metavar="SECONDS",
        help="wall-clock budget of the whole command, reading the instance included: the best plan found "
        "by then is printed (default: [planner] time_limit_s)",
    )
    p.add_argument(
        "--start",
        metavar="PLACEMENT.json",
        help="a viable placement already known ({vm: node}, or a plan JSON with a placement): "
        "one more candidate and CP-SAT's starting point",
    )
    p.add_argument("--format", choices=["json", "text"], default="json", help="output format (default json)")
    p.add_argument("--check", metavar="PLAN.json", help="validate this plan against the instance instead of planning")
    p.set_defaults(func=_plan)
    s = sub.add_parser(
        "schema",
        help="print the JSON Schema of a JSON input (cluster view, instance, plan)",
        description="Print the JSON Schema (draft 2020-12) of a file vjob reads; the same models validate the "
        "files, so an error names the field path the schema describes.",
        epilog=SCHEMA_EPILOG,
    )
    s.add_argument("name", choices=sorted(SCHEMAS), help="which input")
    s.set_defaults(func=_schema)


def _read_json(path: str, what: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(f"{what} {path}: not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{what} {path}: not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise InputError(f"{what} {path}: not JSON (nested too deep)") from None


def _start_placement(path: str) -> dict[str, str]:
    """The --start file: {vm: node}, or a plan JSON whose `placement` is taken."""
    data = _read_json(path, "start placement")
    if isinstance(data, dict) and isinstance(data.get("placement"), dict):
        data = data["placement"]
    if not isinstance(data, dict):
        raise InputError(f"start placement {path}: expected a JSON object mapping vm to node")
    for vm, node in data.items():
        if not isinstance(node, str) or not node:
            raise InputError(f"start placement {path}: vm {vm[:80]!r} = {str(node)[:80]!r}: must be a node id")
    return data


def _plan(args: argparse.Namespace) -> int:
    from preemption.planner import Instance, Plan, make_plan, validate  # heavy: pydantic
    from preemption.planner.clock import process_started  # heavy: pydantic
    from preemption.planner.plan_schema import PlanInput  # heavy: pydantic

    # The budget counts from the process's start (Python's start-up and imports included).
    started = process_started()
    entered = time.perf_counter()
    cfg = load_config(args)
    inst = Instance.from_dict(_read_json(args.instance, "instance"), source=args.instance)
    phases = {"startup": entered - started, "parse": time.perf_counter() - entered}
    if args.check:
        data = _read_json(args.check, "plan")
        PlanInput.parse(data, args.check)
        plan = Plan.from_dict(data, source=args.check)
        validate(inst, plan)
        print(f"plan {args.check} is valid for {args.instance}: cost {plan.cost}, {len(plan.pools)} pool(s)")
        return 0
    time_limit = args.time_limit if args.time_limit is not None else cfg.planner.time_limit_s
    if not time_limit > 0:
        raise InputError(f"--time-limit = {time_limit}: must be > 0 seconds")
    optimizer = args.optimizer or cfg.planner.optimizer
    if optimizer == "cpsat":
        require_extra("vjob plan --optimizer cpsat (--optimizer ffd needs nothing more)", "ortools")
    start = _start_placement(args.start) if args.start else None
    plan = make_plan(
        inst,
        optimizer=optimizer,
        time_limit_s=time_limit,
        hint=start,
        started=started,
        phases=phases,
    )
    if args.format == "json":
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(plan.to_text())
    return 0


def _schema(args: argparse.Namespace) -> int:
    from preemption.planner.instance import InstanceInput  # heavy: pydantic
    from preemption.planner.plan_schema import PlanInput  # heavy: pydantic
    from vjob.json_input import schema  # heavy: pydantic
    from vjob.model import ClusterViewInput  # heavy: pydantic

    models = {"clusterview": ClusterViewInput, "instance": InstanceInput, "plan": PlanInput}
    print(json.dumps(schema(models[args.name]), indent=2))
    return 0
