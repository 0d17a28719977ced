"""What the RMS holds beside vjob's knob: the site's own priority of the queued jobs, read for
the tick's pass (Slurm: sprio), and the values users changed on the knob itself (PBS).

Why a read that may fail quietly: the tick must go on when sprio or `scontrol show config`
does not answer, or when the site's weights leave no room for vjob's tier bands. Without a
reading the pass sends vjob's whole order, as with `order_share = 1` (pass and RMS still
agree on the order; the site's fair share waits for the next good read), and says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from preemption.scheduling.site_order import SiteOrder
from vjob.errors import VjobError


def site_order(adapter: Any, log: Any) -> SiteOrder | None:
    """`adapter.site_priorities()` when it has one (None: vjob owns the order), None on failure."""
    read = getattr(adapter, "site_priorities", None)
    if read is None:
        return None
    try:
        return read()
    except VjobError as exc:
        log.error("cannot read the site's own priorities, sending vjob's whole order this tick", error=str(exc))
        return None


def resync(adapter: Any, sent: dict[str, int], log: Any, exact: Mapping[str, int] | None = None) -> list[str]:
    """Forget what vjob sent to jobs whose RMS now holds another value, so that this tick
    sends vjob's value again; returns those jobs.

    Two cases. `adapter.held` (PBS): a job's owner may `qalter -p` their own job; an RMS whose
    knob users cannot touch (Slurm's site factor) has none. `exact` (the decision's
    `rms_priorities` when `exact_priorities`, Slurm's tier bands): the RMS adds the value to
    the job's own priority, so it must hold this very value, not only one in the same order
    (act.priorities_to_send keeps old values that are still in order, and skips changes below
    the knob's min_step; vjob's part moves in whole steps, site_order.site_value)."""
    changed: list[str] = []
    held = getattr(adapter, "held", None)
    if isinstance(held, dict):
        changed = sorted(j for j, v in sent.items() if j in held and held[j] != v)
        if changed:
            log.warning("a job's priority was changed outside vjob: set again", jobs=changed)
    if exact is not None:
        changed += sorted(j for j, v in sent.items() if j in exact and exact[j] != v and j not in changed)
    for job in changed:
        del sent[job]
    return changed
