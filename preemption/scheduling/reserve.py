"""vjob's interactive reserve: free nodes kept for interactive jobs that have not arrived yet.

Why: bench/policy_admitted_wait.py found that most of an admitted interactive job's wait on
the Lublin trace is the guard refusing to checkpoint one very large batch job (its return
would push the queue's head back by about the interactive job's run). An interactive job that
finds free nodes needs no victim at all. `[scheduling] interactive_reserve_nodes` = R keeps
up to R free nodes out of reach of every start that is not an interactive job within the cap,
and only while the cap has room for that many interactive nodes (a full cap needs no reserve).

Honesty rules, both passes alike (`tick.decide`, `simulator/engine.py`):

* a job of n nodes that is not a privileged interactive job starts only when it leaves the
  reserve free: n + r <= free. A job that could never do so (n + r > total) is not held to
  the reserve at all: holding it would make it wait for more than the machine (a prototype
  that kept the last R free nodes from every batch job never finished such jobs), and
  holding it to the whole machine instead (min(n + r, total)) delayed the largest jobs the
  most (20,000-job Lublin window, seed 1, R = 50: batch response 10.8 h vs 9.3 h at
  20 %/100/15 %, 72.7 h vs 54.2 h at 30 %/150/15 %);
* the head's EASY reservation asks for the same n + r nodes (none extra when the head is
  itself a privileged interactive job), so its reserved start is the one it can have;
* backfilled jobs see r fewer free nodes, so they never eat the reserve.

The fixed reserve idles nodes all the time, also where interactive jobs come seldom (it lost
batch cells, docs/policy.md). `[scheduling] interactive_reserve_arrivals` = k holds it only
while at least k interactive jobs submitted within the last `interactive_reserve_window_s`
are queued or running (`recent_interactive`): a pure function of what the pass observes, so
the agent and the simulator count alike. Jobs of the window that already ended are not
counted (the view does not hold them; the grid's interactive jobs run 600-7,200 s).
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def reserve_nodes(reserve: int, cap_nodes: float, held: int) -> int:
    """The nodes kept free now: `reserve`, at most the cap's room (`cap_nodes` - `held`)."""
    if reserve <= 0:
        return 0
    return max(0, min(reserve, math.floor(cap_nodes - held)))


def need_beside(nodes: int, reserve: int, total: int) -> int:
    """Free nodes a job of `nodes` that may not use the reserve needs to start (and the head's
    EASY reservation asks for): its own and the reserve, or its own alone when both would
    not fit the machine (`total`)."""
    return nodes + reserve if nodes + reserve <= total else nodes


def recent_interactive(submits: Iterable[float], now: float, window_s: float) -> int:
    """How many of the visible interactive jobs' submission times fall within the last
    `window_s` seconds: the observed arrival rate the adaptive reserve reads."""
    since = now - window_s
    return sum(1 for t in submits if t > since)


def reserve_asked(reserve: int, min_arrivals: int, recent: int) -> int:
    """The reserve to hold in this pass: `reserve` while `recent` interactive arrivals reach
    `min_arrivals` (0: always, the fixed reserve), else none."""
    return reserve if recent >= min_arrivals else 0
