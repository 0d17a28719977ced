"""A plan over the VMs of multi-node vjobs turned into the requests their pilots can carry out.

Why: the planner sees each VM of a multi-node vjob (`<vm>-0`, `<vm>-1`…, pilot.multinode)
on the node it runs on, so it weighs the vjob's real size, and its plan holds one action per
VM. But one pilot holds all those VMs and takes one request at a time, and it suspends and
resumes them only as one consistent cut where they are (pilot.switch_requests refuses to move
them one by one). So the member actions of one pilot in one pool become one action on the
pilot's first VM: all suspended → one suspend, all resumed on the nodes they slept on → one
resume in place, all stopped → one stop. The executor journals and keys that one action like
any other, so a restarted agent finishes it with the same request id (agent.recover).

A vjob whose pilot can resume its VMs on other nodes (`movable`: a leader-mode pilot without
a node service's job network, docs/multinode.md) may also be moved whole: all its VMs suspended
in one pool and all resumed, each on its new node, in a later one. The resume is then one
request naming every VM's node in rank order (`nodes`; `whole_moves` finds them in the plan,
`WholeMovePerformer` writes them), and the journalled action is the first VM's resume.

A plan that migrates a member, moves a vjob whose pilot cannot move it, or splits the vjob
(some members only, or over several pools other than one cut's two) is refused whole, before anything is done:
`MembersMoved` says which vjob and why, and `journal_refusal` records it as a failed switch,
every action named.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from agent.pilot_performer import PilotRequestPerformer, _expected, _state
from preemption.executor import ExecutionReport
from preemption.planner import Plan, PlanAction
from vjob.errors import VjobError
from vjob.model import Action
from vjob.pilot_files import PilotState, RequestKind
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


def coalesce(plan: Plan, members: Members, movable: Collection[str] = ()) -> Plan:
    """`plan` with each multi-node vjob's member actions as one action on its pilot's first VM.

    Raises MembersMoved, naming the vjob and what the plan asks, when its pilot cannot do it
    as one request. Vjobs not in `members` (one VM per pilot) keep their actions; vjobs in
    `movable` may be resumed away from where they slept (a whole move: `whole_moves`)."""
    where = {vm: vjob for vjob, vms in members.items() for vm, _node in vms}
    pools_of: dict[str, dict[int, list[PlanAction]]] = {}
    for index, pool in enumerate(plan.pools):
        for a in pool:
            if a.vm in where:
                pools_of.setdefault(where[a.vm], {}).setdefault(index, []).append(a)
    for vjob, by_pool in pools_of.items():
        if len(by_pool) > 1 and not _one_cut(by_pool):
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
            _one_request(vjob, by_pool[index], members[vjob], vjob in movable)
            for vjob, by_pool in pools_of.items()
            if index in by_pool
        ]
        pools.append(tuple(out))
    return Plan(tuple(pools), plan.placement, plan.cost, plan.optimizer, plan.warnings, plan.stats)


def _one_cut(by_pool: Mapping[int, Sequence[PlanAction]]) -> bool:
    """Whether a vjob's actions over several pools are one cut: its suspends in one pool, its
    resumes in a later one (each pool then one request; whether it may move: `_one_request`)."""
    if len(by_pool) != 2:
        return False
    first, second = (by_pool[i] for i in sorted(by_pool))
    return all(a.kind is Action.SUSPEND for a in first) and all(a.kind is Action.RESUME for a in second)


def _one_request(
    vjob: str, acts: Sequence[PlanAction], vms: Sequence[tuple[str, str]], movable: bool = False
) -> PlanAction:
    """The one action the pilot of `vjob` carries out for all of `acts` (one per member)."""
    node_of = dict(vms)
    moved = [a for a in acts if a.kind is Action.MIGRATE]
    if moved:
        raise MembersMoved(
            f"vjob {vjob}: the plan migrates its VMs ({_moves(moved)}); a multi-node vjob is not "
            "moved VM by VM (its pilot suspends and resumes it as one cut where its VMs are)",
            moved,
        )
    stale = [a for a in acts if a.kind is Action.RESUME and a.src != node_of[a.vm]]
    away = [a for a in acts if a.kind is Action.RESUME and a.dst != node_of[a.vm]]
    if stale or (away and not movable):
        raise MembersMoved(
            f"vjob {vjob}: the plan resumes its VMs away from the nodes they slept on "
            f"({_moves(stale or away)}); "
            + (
                "its VMs' states are elsewhere"
                if stale
                else "its pilot resumes them only in place (per-node pilots, or a node service's job network)"
            ),
            stale or away,
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
        dst = next(a.dst for a in acts if a.vm == leader)
        return PlanAction(Action.RESUME, leader, vjob, home, dst)
    if kind in (Action.SUSPEND, Action.STOP):
        return PlanAction(kind, leader, vjob, home)
    raise MembersMoved(f"vjob {vjob}: a {kind.value} of its VMs is the resource manager's to do", acts)


def whole_moves(plan: Plan, members: Members) -> dict[str, tuple[str, ...]]:
    """vjob → the node of each of its VMs, in rank order, for every multi-node vjob the plan
    resumes anywhere but where it slept (coalesce checked it is movable and resumed whole)."""
    out: dict[str, tuple[str, ...]] = {}
    for vjob, vms in members.items():
        dst = {a.vm: a.dst for a in plan.actions if a.kind is Action.RESUME and a.vjob == vjob}
        if len(dst) == len(vms) and any(dst[vm] != node for vm, node in vms):
            out[vjob] = tuple(dst[vm] or node for vm, node in vms)
    return out


class WholeMovePerformer:
    """The pilots' performer (agent.pilot_performer) for a plan with whole moves: the resume of
    a vjob in `moves` is one request whose `nodes` name each VM's new node in rank order (what
    the pilot's JobVMs.move needs); every other action is the inner performer's own.

    Why the list travels in the request and not in the journalled action: a plan action names
    one node. A restarted agent's recovery rebuilds every VM's node from the placement journalled
    with the switch (agent.remap_whole.journalled_moves) and sends the same request again
    through this performer, under the same request id (docs/remap.md)."""

    def __init__(self, inner: PilotRequestPerformer, moves: Mapping[str, Sequence[str]]) -> None:
        self.inner = inner
        self.moves = {vjob: tuple(nodes) for vjob, nodes in moves.items()}

    def perform(self, action: PlanAction, key: str) -> None:
        nodes = self.moves.get(action.vjob) if action.kind is Action.RESUME else None
        if nodes is None:
            self.inner.perform(action, key)
            return
        pdir = self.inner.pilot_dir(action)
        st = _state(pdir)
        if st is None or st.request_id != key:  # a repeated action already answered is not asked again
            pdir.request(
                RequestKind.RESUME,
                key,
                node=nodes[0],
                from_node=action.src or "",
                reason=self.inner.reason,
                nodes=nodes,
            )
        answer = self.inner._wait(pdir, key, action)
        if answer.request_error:
            raise VjobError(f"resume {action.vm}: the pilot refused: {answer.request_error}")
        if answer.state is not _expected(action) or list(answer.member_nodes) != list(nodes):
            raise VjobError(
                f"resume {action.vm}: the pilot answered {answer.state.value} on "
                f"{', '.join(answer.member_nodes) or answer.node}, not {PilotState.RUNNING.value} on {', '.join(nodes)}"
            )


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


__all__ = ["NOT_STARTED", "Members", "MembersMoved", "WholeMovePerformer", "coalesce", "journal_refusal", "whole_moves"]
