"""A plan over the VMs of multi-node vjobs turned into the requests their pilots can carry out.

Why: the planner sees each VM of a multi-node vjob (`<vm>-0`, `<vm>-1`…, pilot.multinode)
on the node it runs on, so it weighs the vjob's real size, and its plan holds one action per
VM. But one pilot holds all those VMs and takes one request at a time, and it suspends and
resumes them only as one consistent cut where they are (pilot.switch_requests refuses to move
them one by one). So the member actions of one pilot in one pool become one action on the
pilot's first VM: all suspended → one suspend, all resumed on the nodes they slept on → one
resume in place, all stopped → one stop. The executor journals and keys that one action like
any other, so a restarted agent finishes it with the same request id (agent.recover).

A plan that moves a member (migrate, resume elsewhere) or splits the vjob (some members only,
or over several pools) is refused whole, before anything is done: `MembersMoved` says which
vjob and why, and `journal_refusal` records it as a failed switch, every action named.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from preemption.executor import ExecutionReport
from preemption.planner import Plan, PlanAction
from vjob.errors import VjobError
from vjob.model import Action
from vjob.store import journal
from vjob.store.db import Store

Members = Mapping[str, Sequence[tuple[str, str]]]
"""vjob → (VM, node) of each VM of a multi-node pilot, its first VM (the pilot's own) first."""

NOT_STARTED = "not started: the switch was refused before any action was done"


class MembersMoved(VjobError):
    """The plan would move (or split) a multi-node vjob's VMs; `actions` are the offending ones."""

    def __init__(self, message: str, actions: Sequence[PlanAction]) -> None:
        super().__init__(message)
        self.actions = tuple(actions)


def coalesce(plan: Plan, members: Members) -> Plan:
    """`plan` with each multi-node vjob's member actions as one action on its pilot's first VM.

    Raises MembersMoved, naming the vjob and what the plan asks, when its pilot cannot do it
    as one request. Vjobs not in `members` (one VM per pilot) keep their actions."""
    where = {vm: vjob for vjob, vms in members.items() for vm, _node in vms}
    pools_of: dict[str, dict[int, list[PlanAction]]] = {}
    for index, pool in enumerate(plan.pools):
        for a in pool:
            if a.vm in where:
                pools_of.setdefault(where[a.vm], {}).setdefault(index, []).append(a)
    for vjob, by_pool in pools_of.items():
        if len(by_pool) > 1:
            split = [a for acts in by_pool.values() for a in acts]
            raise MembersMoved(
                f"vjob {vjob}: the plan acts on its VMs in pools {', '.join(map(str, by_pool))}; "
                "its pilot switches them all at once",
                split,
            )
    pools: list[tuple[PlanAction, ...]] = []
    for index, pool in enumerate(plan.pools):
        out = [a for a in pool if a.vm not in where]
        out += [
            _one_request(vjob, by_pool[index], members[vjob]) for vjob, by_pool in pools_of.items() if index in by_pool
        ]
        pools.append(tuple(out))
    return Plan(tuple(pools), plan.placement, plan.cost, plan.optimizer, plan.warnings, plan.stats)


def _one_request(vjob: str, acts: Sequence[PlanAction], vms: Sequence[tuple[str, str]]) -> PlanAction:
    """The one action the pilot of `vjob` carries out for all of `acts` (one per member)."""
    node_of = dict(vms)
    moved = [a for a in acts if a.kind is Action.MIGRATE]
    if moved:
        raise MembersMoved(
            f"vjob {vjob}: the plan migrates its VMs ({_moves(moved)}); a multi-node vjob is not "
            "moved VM by VM (its pilot suspends and resumes it as one cut where its VMs are)",
            moved,
        )
    away = [a for a in acts if a.kind is Action.RESUME and (a.dst != node_of[a.vm] or a.src != node_of[a.vm])]
    if away:
        raise MembersMoved(
            f"vjob {vjob}: the plan resumes its VMs away from the nodes they slept on "
            f"({_moves(away)}); a multi-node vjob resumes only in place",
            away,
        )
    kinds = {a.kind for a in acts}
    if len(kinds) > 1 or sorted(vm for vm, _ in vms) != sorted(a.vm for a in acts):
        what = ", ".join(f"{a.kind.value} {a.vm}" for a in acts)
        raise MembersMoved(
            f"vjob {vjob}: the plan asks {what}, not one action for all its {len(vms)} VMs; its "
            "pilot switches them all at once",
            acts,
        )
    (kind,) = kinds
    leader, home = vms[0]
    if kind is Action.RESUME:
        return PlanAction(Action.RESUME, leader, vjob, home, home)
    if kind in (Action.SUSPEND, Action.STOP):
        return PlanAction(kind, leader, vjob, home)
    raise MembersMoved(f"vjob {vjob}: a {kind.value} of its VMs is the resource manager's to do", acts)


def _moves(acts: Sequence[PlanAction]) -> str:
    return ", ".join(f"{a.vm} {a.src}→{a.dst}" for a in acts)


def journal_refusal(
    store: Store, plan: Plan, refused: MembersMoved, *, reason: str, tag: str, job_key: Callable[[PlanAction], str]
) -> ExecutionReport:
    """Record the refused plan as a failed switch (`vjob status` lists it): the offending
    actions failed with the reason, the others failed as never started."""
    planned = [
        journal.PlannedAction(i, a.kind.value, a.vm, job_key(a), a.src, a.dst)
        for i, pool in enumerate(plan.pools)
        for a in pool
    ]
    switch_id, ids = journal.open_switch(store, reason, plan.to_dict() | {"executor": tag}, planned)
    bad = set(refused.actions)
    report = ExecutionReport(switch_id=switch_id, state="failed", pools_done=0)
    for a, rid in zip(plan.actions, ids, strict=True):
        error = str(refused) if a in bad else NOT_STARTED
        journal.set_action(store, rid, "failed", error)
        if a in bad:
            report.failed.append((a, error))
        else:
            report.not_started.append(a)
    journal.set_switch(store, switch_id, "failed")
    return report


__all__ = ["NOT_STARTED", "Members", "MembersMoved", "coalesce", "journal_refusal"]
