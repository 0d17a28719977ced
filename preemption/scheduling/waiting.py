"""Why an interactive job the pass does not start waits, as data.

Why a record of its own: a user whose interactive job stays PENDING sees only the RMS's reason
("Priority", "Resources"), which does not say that vjob held it back, nor what would change
that. The pass (`tick.decide`) knows the reason at the moment it gives up on the job — the cap,
no victim it may checkpoint, the guard protecting the queue's first batch job, or a job ahead
of it holding the head — so it records it there, as a `WaitReason`, and the agent puts
`text()` where the user can read it (docs/slurm-agent.md, "Why is my interactive job
waiting?"). Pure: the same pass gives the same reasons, and the agent writes only a changed one.

The text is vjob's own: it never holds whitespace other than single spaces, brackets or
commas (vjob.record_words keeps it apart from other words of the same field; PBS's qalter
splits `-W` values on commas), and it is short (Slurm shows it in `scontrol show job`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from ubis_priority.interactive import cap_limit, within_cap
from vjob.config import PriorityConfig


class WaitKind(StrEnum):
    CAP = "cap"
    """Interactive jobs hold the share of the machine `[priority] interactive_cap` allows."""
    USER_CAP = "user_cap"
    """The job's user holds the share `[priority] interactive_user_cap` allows."""
    NO_VICTIM = "no_victim"
    """Too few nodes free, and not enough running vjobs vjob may checkpoint to free them."""
    GUARD = "guard"
    """Checkpointing victims would delay the queue's first batch job beyond the slack."""
    BEHIND = "behind"
    """A job ahead of it in vjob's order holds the head of the queue (its reservation)."""
    NO_PREEMPTION = "no_preemption"
    """The site's policy does not preempt: the job waits for free nodes."""
    TOO_LARGE = "too_large"
    """It asks more nodes than the cluster has usable."""


@dataclass(frozen=True)
class WaitReason:
    """Why one interactive job waits this tick; `text()` is what the user reads."""

    kind: WaitKind
    held: int = 0
    """CAP, USER_CAP: the nodes interactive jobs (of the user) hold."""
    limit: int = 0
    """CAP, USER_CAP: the most they may hold; NO_VICTIM, TOO_LARGE: the nodes to be had."""
    request: int = 0
    """The nodes the job asks for."""
    job: str = ""
    """GUARD: the batch job it would delay; BEHIND: the job at the head."""
    delay_s: float = 0.0
    """GUARD: how much later that job's reserved start would be."""

    def text(self) -> str:
        """One line, `vjob: ...`, for the RMS's field and `vjob status`."""
        k = self.kind
        if k is WaitKind.CAP:
            return f"vjob: interactive cap reached ({self.held}/{self.limit} nodes; this job asks {self.request})"
        if k is WaitKind.USER_CAP:
            return f"vjob: your interactive cap reached ({self.held}/{self.limit} nodes; this job asks {self.request})"
        if k is WaitKind.NO_VICTIM:
            return f"vjob: no checkpointable victim (can free {self.limit} of {self.request} nodes)"
        if k is WaitKind.GUARD:
            return f"vjob: would delay job {self.job} by {_minutes(self.delay_s)} min"
        if k is WaitKind.BEHIND:
            return f"vjob: waits behind job {self.job} at the head of the queue"
        if k is WaitKind.TOO_LARGE:
            return f"vjob: asks {self.request} nodes but the cluster has {self.limit} usable"
        return f"vjob: waits for {self.request} free nodes (the policy does not preempt)"


def _minutes(seconds: float) -> int:
    """Whole minutes, at least 1 (a delay the guard refused is never 'by 0 min')."""
    if not math.isfinite(seconds):
        return 99999
    return max(1, math.ceil(seconds / 60.0))


def cap_reason(cfg: PriorityConfig, total_nodes: int, held: int, user_held: int, request: int) -> WaitReason:
    """Which cap an interactive job of `request` nodes is over (`ubis_priority.allowed` said
    it is over one): the machine's, else its user's."""
    limit = cap_limit(cfg.interactive_cap, total_nodes)
    if not within_cap(float(held), float(request), limit) or cfg.interactive_user_cap is None:
        return WaitReason(WaitKind.CAP, held=held, limit=math.floor(limit), request=request)
    user_limit = cap_limit(cfg.interactive_user_cap, total_nodes)
    return WaitReason(WaitKind.USER_CAP, held=user_held, limit=math.floor(user_limit), request=request)


__all__ = ["WaitKind", "WaitReason", "cap_reason"]
