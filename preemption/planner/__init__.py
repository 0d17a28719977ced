"""The Entropy cluster-wide context switch planner (see preemption/__init__.py for the API)."""

from __future__ import annotations

from preemption.planner.diagnose import NoViablePlacementError
from preemption.planner.instance import Instance, NodeSpec, VMSpec, instance_from_view
from preemption.planner.optimizer import make_plan
from preemption.planner.plan import Plan, PlanAction, local_cost, plan_cost
from preemption.planner.sequencing import SequencingError, build_plan
from preemption.planner.validator import PlanInvalidError, validate

__all__ = [
    "Instance",
    "NoViablePlacementError",
    "NodeSpec",
    "Plan",
    "PlanAction",
    "PlanInvalidError",
    "SequencingError",
    "VMSpec",
    "build_plan",
    "instance_from_view",
    "local_cost",
    "make_plan",
    "plan_cost",
    "validate",
]
