"""Each user's fair share as UBIS's usage term sees it, for `vjob prio --users` (like `sshare`).

Why its own view: a user asking why their jobs rank low needs their target, their decayed usage
and the term those give, not one job's seven terms. The numbers are the kernel's: the same
(user, account) entities, target shares and usage shares (`shares.py`), and the same
normalisation, (Target − Usage + 1) / 2 clipped to 0..1, times the usage weight.
"""

from __future__ import annotations

from dataclasses import dataclass

from ubis_priority.shares import share_entities, target_shares, usage_shares
from vjob.config import PriorityConfig
from vjob.model import ClusterView


@dataclass(frozen=True)
class UserShare:
    user: str
    account: str
    target: float
    """The target share of the cluster (0..1)."""
    usage: float
    """Decayed usage in node-seconds (`[priority] usage_half_life_s`)."""
    usage_share: float
    """That usage over everybody's (0..1)."""
    term: float
    """(target − usage share + 1) / 2, clipped to 0..1: the normalised usage term."""
    weighted: float
    """`term` × the usage weight: what it adds to each of the user's jobs' priority."""


def user_shares(view: ClusterView, cfg: PriorityConfig) -> list[UserShare]:
    """One row per (user, account) entity the kernel rates, lowest term first (the users the
    fair share holds back most head the list, as `sshare` users look for them)."""
    entities = share_entities(view.jobs, (*view.usage, *view.targets))
    targets = target_shares(entities, view.targets, cfg)
    shares = usage_shares(view.usage)
    weight = cfg.weights.usage
    out = []
    for user, account in entities:
        target = targets[(user, account)]
        used = shares.get(user, 0.0)
        term = min(1.0, max(0.0, (target - used + 1.0) / 2.0))
        out.append(UserShare(user, account, target, float(view.usage.get(user, 0.0)), used, term, term * weight))
    return sorted(out, key=lambda s: (s.term, s.user, s.account))


__all__ = ["UserShare", "user_shares"]
