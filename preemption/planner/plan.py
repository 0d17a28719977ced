"""A reconfiguration plan: a sequence of pools of VM actions, and the Entropy cost model.

Why the cost model lives beside the plan type: the planner, the validator, the optimiser and
the benchmark must agree on one definition. An action's local cost is what the Entropy paper
measured (section 2.3, Table 1): migrate and suspend cost the VM's memory, a resume its memory
when the state file is on the destination node and twice that when it must be copied there,
run and stop nothing. A pool lasts as long as its dearest action, and every action also pays
for the pools before it, so the model rewards few, parallel pools and cheap actions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vjob.errors import InputError
from vjob.model import Action


@dataclass(frozen=True, slots=True)
class PlanAction:
    """One VM action. `src` is where the VM (or its state) is, `dst` where it goes.

    run: dst; stop and suspend: src (the suspended state stays on src); resume: dst, and src
    the node holding the state (None: the repository); migrate: src and dst.
    """

    kind: Action
    vm: str
    vjob: str
    src: str | None = None
    dst: str | None = None

    @property
    def node(self) -> str | None:
        """The node the action is about: the destination, else the source."""
        return self.dst if self.dst is not None else self.src

    @property
    def local(self) -> bool:
        """For a resume: whether the state file already lies on the destination."""
        return self.kind is Action.RESUME and self.src == self.dst

    def to_dict(self) -> dict[str, Any]:
        k = self.kind
        if k is Action.MIGRATE:
            return {"action": k.value, "vm": self.vm, "vjob": self.vjob, "from": self.src, "to": self.dst}
        if k is Action.RESUME:
            return {"action": k.value, "vm": self.vm, "vjob": self.vjob, "on": self.dst, "from": self.src}
        on = self.dst if k is Action.RUN else self.src
        return {"action": k.value, "vm": self.vm, "vjob": self.vjob, "on": on}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> PlanAction:
        if not isinstance(data, Mapping):
            raise InputError(f"{where}: expected an object")
        try:
            kind = Action(data.get("action"))
        except ValueError:
            allowed = ", ".join(a.value for a in Action)
            raise InputError(f"{where}.action = {data.get('action')!r}: must be one of {allowed}") from None
        vm = data.get("vm")
        if not isinstance(vm, str) or not vm:
            raise InputError(f"{where}.vm = {vm!r}: must be a non-empty string")
        vjob = str(data.get("vjob", ""))
        if kind is Action.MIGRATE:
            return cls(kind, vm, vjob, _node(data, "from", where), _node(data, "to", where))
        if kind is Action.RESUME:
            src = data.get("from")
            return cls(kind, vm, vjob, None if src is None else _node(data, "from", where), _node(data, "on", where))
        on = _node(data, "on", where)
        return cls(kind, vm, vjob, None, on) if kind is Action.RUN else cls(kind, vm, vjob, on, None)


def _node(data: Mapping[str, Any], key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise InputError(f"{where}.{key} = {value!r}: must be a node id")
    return value


def local_cost(action: PlanAction, mem: int) -> int:
    """The cost of `action` alone on a VM of `mem` MB (Entropy, Table 1)."""
    if action.kind in (Action.MIGRATE, Action.SUSPEND):
        return mem
    if action.kind is Action.RESUME:
        return mem if action.local else 2 * mem
    return 0


def plan_cost(pools: Sequence[Sequence[PlanAction]], mem_of: Mapping[str, int]) -> int:
    """Σ over actions of (cost of the pools before it + its local cost); a pool costs its dearest action."""
    total = 0
    before = 0
    for pool in pools:
        costs = [local_cost(a, mem_of[a.vm]) for a in pool]
        total += len(pool) * before + sum(costs)
        before += max(costs, default=0)
    return total


@dataclass(frozen=True)
class Plan:
    """The planner's answer: the target placement and the pools that reach it."""

    pools: tuple[tuple[PlanAction, ...], ...]
    placement: Mapping[str, str]
    cost: int
    optimizer: str = ""
    warnings: tuple[str, ...] = ()
    stats: Mapping[str, Any] = field(default_factory=dict)

    @property
    def actions(self) -> list[PlanAction]:
        return [a for pool in self.pools for a in pool]

    def count(self) -> dict[str, int]:
        """How many actions of each kind, for summaries and logs."""
        out = {a.value: 0 for a in Action}
        for a in self.actions:
            out[a.kind.value] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "cost": self.cost,
            "placement": dict(sorted(self.placement.items())),
            "pools": [[a.to_dict() for a in pool] for pool in self.pools],
            "optimizer": self.optimizer,
            "warnings": list(self.warnings),
            "stats": dict(self.stats),
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "plan") -> Plan:
        if not isinstance(data, Mapping):
            raise InputError(f"{source}: expected a JSON object")
        pools_raw = data.get("pools")
        if not isinstance(pools_raw, list) or not all(isinstance(p, list) for p in pools_raw):
            raise InputError(f"{source}.pools: must be a list of lists of actions")
        pools = tuple(
            tuple(PlanAction.from_dict(a, f"{source}.pools[{i}][{j}]") for j, a in enumerate(pool))
            for i, pool in enumerate(pools_raw)
        )
        placement = data.get("placement", {})
        if not isinstance(placement, Mapping):
            raise InputError(f"{source}.placement: must be an object mapping vm to node")
        cost = data.get("cost", 0)
        if isinstance(cost, bool) or not isinstance(cost, int):
            raise InputError(f"{source}.cost = {cost!r}: must be an integer")
        return cls(
            pools=pools,
            placement={str(k): str(v) for k, v in placement.items()},
            cost=cost,
            optimizer=str(data.get("optimizer", "")),
            warnings=tuple(str(w) for w in data.get("warnings", [])),
            stats=dict(data.get("stats", {})),
        )

    def to_text(self) -> str:
        """A human-readable listing: one line per pool, then the totals."""
        lines = []
        for i, pool in enumerate(self.pools):
            parts = []
            for a in pool:
                if a.kind is Action.MIGRATE:
                    parts.append(f"migrate({a.vm} {a.src}->{a.dst})")
                elif a.kind is Action.RESUME:
                    where = "local" if a.local else f"from {a.src or 'repository'}"
                    parts.append(f"resume({a.vm} on {a.dst}, {where})")
                else:
                    parts.append(f"{a.kind.value}({a.vm} on {a.node})")
            lines.append(f"pool {i}: " + ", ".join(parts))
        counts = ", ".join(f"{n} {k}" for k, n in self.count().items() if n)
        lines.append(
            f"cost {self.cost}; {len(self.pools)} pool(s); {counts or 'no action'}; optimizer {self.optimizer}"
        )
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines)
