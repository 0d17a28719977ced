"""The scheduling policies as queue orders plus a preemption switch: the options of the one
scheduling pass (`tick.decide`, which the agent runs and the simulator's compiled pass
mirrors).

Why a policy is an order: with EASY backfilling as the shared mechanism (easy.py), what
distinguishes the paper's contenders is whom the scheduler serves first and whether an
interactive job may take nodes from running batch jobs:

- `fcfs-easy`: submission order; no class is special; nobody is preempted.
- `mms` (the paper's "modified Maui scheduler"): interactive jobs within the interactive cap
  go first, in submission order, and the first of them that does not fit gets the EASY
  reservation (Maui gathers nodes for it as they free up); no preemption.
- `mms-block`: `mms` as the UBIS paper describes its baseline's behaviour ("blocks for
  available nodes, preventing any new jobs from executing until the high priority job receives
  its resource requirements"): no backfilling while an interactive job holds the reservation.
- `ubis`: UBIS priority order (ubis_priority's kernel); an interactive job within the cap
  that does not fit checkpoints the lowest-priority batch jobs (victims.py) and starts once
  their checkpoints are written; preempted jobs queue again with their Pn/Pt raised.
- `vjob` (the default; docs/policy.md): tiers — interactive jobs within the cap, then the
  jobs vjob checkpointed (they already waited), then the rest — and within a tier, as
  `[scheduling] tier_order` says, submission time (the default), or the UBIS priority, highest
  first, in the interactive tier only (`ubis-interactive`) or in every tier (`ubis`): the
  weights and a user's fair share then decide who goes first inside a ranked tier but never
  lift a job into another; an interactive job within the cap that does
  not fit checkpoints batch jobs chosen by cost (fewest earlier preemptions, then nodes
  already on its image, then the smallest checkpoint), never a job already preempted
  `[scheduling] max_preemptions` times, and only when that does not push the reserved start
  of the first batch job in the queue back by more than `head_slack_s`; otherwise it waits
  for nodes as under `mms`.

Interactive jobs beyond the cap are ordinary jobs under every policy (ubis_priority sets
their I term to 0): they are neither refused nor allowed to preempt. That is the `preempt`
cap mode; the `hard` cap mode reads the paper literally: an interactive job beyond the cap
does not start at all until it is within the cap again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from vjob.errors import InputError


class Order(Enum):
    """Whom a policy serves first (the queue order of the one pass)."""

    SUBMIT = "submit"
    """fcfs-easy: submission order."""
    PRIVILEGED_FIRST = "privileged-first"
    """mms, mms-block: interactive jobs within the cap, then everyone else (`mms_order`)."""
    UBIS = "ubis"
    """ubis: the UBIS priority, highest first (`ubis_order`)."""
    TIERS = "tiers"
    """vjob: privileged, checkpointed, (interactive,) the rest, each tier by UBIS priority
    (`vjob_order`)."""


@dataclass(frozen=True)
class Policy:
    """What the agent and every simulator loop ask of a policy, resolved once by name (the
    string branches these fields replace drifted apart between the live pass and the replays)."""

    name: str
    order: Order
    preempts: bool
    """Interactive jobs within the cap may checkpoint running batch jobs."""
    blocks_behind_interactive: bool
    """Nothing backfills while an interactive job holds the reservation."""
    victims_by_cost: bool
    """Victims by cost (earlier preemptions, nodes on the image, checkpoint size) and the head
    guard, rather than by lowest UBIS priority."""
    exact_ubis: bool
    """The order is the UBIS priority alone, recomputed at every pass (the simulator keeps
    the queued jobs' rows for its compiled ranking, `ubis_leading`). vjob rates its queue at
    every pass too, but sorts it inside its tiers (`vjob_order`), from the jobs' columns."""


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy(
            "vjob", Order.TIERS, preempts=True, blocks_behind_interactive=False, victims_by_cost=True, exact_ubis=False
        ),
        Policy(
            "fcfs-easy",
            Order.SUBMIT,
            preempts=False,
            blocks_behind_interactive=False,
            victims_by_cost=False,
            exact_ubis=False,
        ),
        Policy(
            "mms",
            Order.PRIVILEGED_FIRST,
            preempts=False,
            blocks_behind_interactive=False,
            victims_by_cost=False,
            exact_ubis=False,
        ),
        Policy(
            "mms-block",
            Order.PRIVILEGED_FIRST,
            preempts=False,
            blocks_behind_interactive=True,
            victims_by_cost=False,
            exact_ubis=False,
        ),
        Policy(
            "ubis", Order.UBIS, preempts=True, blocks_behind_interactive=False, victims_by_cost=False, exact_ubis=True
        ),
    )
}
"""Every policy by name; the one table the agent, the simulator and the replays read."""

CAP_MODES = ("preempt", "hard")


def policy_named(name: str) -> Policy:
    """The policy called `name`, or an InputError naming the value and the known ones."""
    if name not in POLICIES:
        raise InputError(f"--policy = {name[:40]!r}: must be one of {', '.join(POLICIES)}")
    return POLICIES[name]


def check_cap_mode(name: str) -> str:
    """`name` if it is a known cap mode, else an InputError listing them."""
    if name not in CAP_MODES:
        raise InputError(f"--cap-mode = {name!r}: must be one of {', '.join(CAP_MODES)}")
    return name


def fcfs_order(submit: Sequence[float] | np.ndarray) -> np.ndarray:
    """Indices in submission order (stable: equal times keep their given order)."""
    return np.argsort(np.asarray(submit, dtype=np.float64), kind="stable")


def mms_order(submit: Sequence[float] | np.ndarray, privileged: Sequence[bool] | np.ndarray) -> np.ndarray:
    """Privileged interactive jobs first, then everyone else, each group in submission order."""
    sub = np.asarray(submit, dtype=np.float64)
    priv = np.asarray(privileged, dtype=bool)
    return np.lexsort((sub, ~priv))


def ubis_order(priority: Sequence[float] | np.ndarray, submit: Sequence[float] | np.ndarray) -> np.ndarray:
    """Highest UBIS priority first; ties to the earlier submission."""
    return np.lexsort((np.asarray(submit, dtype=np.float64), -np.asarray(priority, dtype=np.float64)))


def vjob_order(
    submit: Sequence[float] | np.ndarray,
    privileged: Sequence[bool] | np.ndarray,
    resumed: Sequence[bool] | np.ndarray,
    interactive: Sequence[bool] | np.ndarray | None = None,
    priority: Sequence[float] | np.ndarray | None = None,
    tie: Sequence[int] | np.ndarray | None = None,
) -> np.ndarray:
    """Privileged interactive jobs first, then jobs checkpointed before (they already
    waited), then (when `interactive` is given) the other interactive jobs, then everyone
    else (`vjob_tiers`); within a tier the highest UBIS `priority` first, then the earlier
    submission, then the smaller `tie` (the job id's rank; equal keys keep their given order).
    Without `priority` a tier is in submission order (the remap replay's reading, which rates
    no priority)."""
    sub = np.asarray(submit, dtype=np.float64)
    tiers = vjob_tiers(privileged, resumed, interactive)
    if priority is None:
        return np.lexsort((sub, tiers))
    ties = np.arange(sub.shape[0]) if tie is None else np.asarray(tie, dtype=np.int64)
    return np.lexsort((ties, sub, -np.asarray(priority, dtype=np.float64), tiers))


TIER_NAMES = ("interactive", "checkpointed", "interactive-ahead", "batch")
"""`vjob_tiers`'s tiers by number, as `vjob prio --explain` names them ("batch" also holds
interactive jobs beyond the cap when `interactive_ahead` does not lift them)."""


def vjob_tiers(
    privileged: Sequence[bool] | np.ndarray,
    resumed: Sequence[bool] | np.ndarray,
    interactive: Sequence[bool] | np.ndarray | None = None,
) -> np.ndarray:
    """Each job's group in `vjob_order`: 0 privileged interactive, 1 resumed, 2 the other
    interactive jobs (only when `interactive` is given: `[scheduling] interactive_ahead`),
    3 the rest."""
    priv = np.asarray(privileged, dtype=bool)
    tier = np.where(np.asarray(resumed, dtype=bool), 1, 3)
    if interactive is not None:
        tier = np.where(np.asarray(interactive, dtype=bool) & (tier == 3), 2, tier)
    return np.where(priv, 0, tier)
