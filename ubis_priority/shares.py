"""Target and usage shares: the two halves of UBIS's (Target − Usage) term.

Why shares and not node-seconds: a target is a fraction of the cluster (configuration says
"alice 0.3"), so usage is turned into the same unit — the user's decayed node-seconds over
everybody's — and the difference lies in -1..1 whatever the cluster size or the decay.

Whose target applies to a job, in this order: the user's own (configuration first, then the
store's copy in the ClusterView); else the job's account's share (configuration
`account_targets`) split equally between the users of that account present in the view; else
an equal part of what the explicit targets leave over, split between all remaining users.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from vjob.config import PriorityConfig
from vjob.errors import InputError
from vjob.model import Job


def _checked(values: Mapping[str, float], what: str, upper: float | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in values.items():
        v = float(value)
        if not math.isfinite(v) or v < 0 or (upper is not None and v > upper):
            allowed = f"0..{upper:g}" if upper is not None else ">= 0"
            raise InputError(f"{what}.{name} = {value!r}: must be a finite number in {allowed}")
        out[name] = v
    return out


def usage_total(values: Iterable[float]) -> float:
    """The sum of everybody's usage, added as NumPy adds (pairwise, in the given order).

    Why not `math.fsum`: the simulator's compiled kernel sums its usage vector this way
    (`compiled.numpy_sum`, held bit-equal to NumPy by tests/test_priority_compiled.py), and the
    live decision and the simulator must give the same priorities to the last bit on the same
    state (tests/test_decision_differential.py).
    """
    return float(np.sum(np.fromiter(values, dtype=np.float64)))


def usage_shares(usage: Mapping[str, float]) -> dict[str, float]:
    """Each user's part (0..1) of the decayed usage of all users; all 0 when nobody used anything."""
    checked = _checked(usage, "usage", None)
    total = usage_total(checked.values())
    if total <= 0:
        return dict.fromkeys(checked, 0.0)
    return {name: value / total for name, value in checked.items()}


def share_entities(jobs: Iterable[Job], names: Iterable[str]) -> list[tuple[str, str]]:
    """The (user, account) entities that share the cluster, sorted: one per user and account
    seen in `jobs`, plus (name, "") for the users in `names` (usage or target records) who
    have no job in `jobs`.

    Why not always (name, ""): a user whose jobs run under an account with an
    `account_targets` share would then also count among the users who split what is left over,
    taking a part nobody's job uses.
    """
    return share_entities_of({(j.user, j.account) for j in jobs}, names)


def share_entities_of(pairs: Iterable[tuple[str, str]], names: Iterable[str]) -> list[tuple[str, str]]:
    """`share_entities` from the jobs' (user, account) pairs, gathered once
    (ubis_priority.job_columns numbers them per job rather than reading every Job again)."""
    found = set(pairs)
    users = {u for u, _ in found}
    found |= {(u, "") for u in names if u not in users}
    return sorted(found)


def target_shares(
    entities: Iterable[tuple[str, str]],
    view_targets: Mapping[str, float],
    cfg: PriorityConfig,
) -> dict[tuple[str, str], float]:
    """The target share of every (user, account) entity, following the module's rules."""
    explicit = _checked(view_targets, "targets", 1.0)
    explicit.update(cfg.targets)
    pairs = sorted(set(entities))
    by_account: dict[str, set[str]] = {}
    for user, account in pairs:
        if user not in explicit and account in cfg.account_targets:
            by_account.setdefault(account, set()).add(user)
    handed_out = math.fsum(explicit.values()) + math.fsum(cfg.account_targets[a] for a in by_account)
    rest = sorted({u for u, a in pairs if u not in explicit and a not in by_account})
    left = max(0.0, 1.0 - handed_out)
    equal = left / len(rest) if rest else 0.0
    out: dict[tuple[str, str], float] = {}
    for user, account in pairs:
        if user in explicit:
            out[(user, account)] = explicit[user]
        elif account in by_account:
            out[(user, account)] = cfg.account_targets[account] / len(by_account[account])
        else:
            out[(user, account)] = equal
    return out
