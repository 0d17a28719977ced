"""The seven UBIS terms: their names, their order, and the scale each is normalised to.

Why one list here: the kernel, the per-job reference, the explanation and the CLI columns must
agree on which term is which. The names are those of `[priority.weights]`, so a weight, a
column of `vjob prio` and a line of `--explain` carry the same word.
"""

from __future__ import annotations

from typing import Final

from vjob.config import PriorityWeights

TERMS: Final[tuple[str, ...]] = (
    "usage",
    "queue_time",
    "os_available",
    "preempt_count",
    "preempt_time",
    "free_nodes",
    "interactive",
)
"""The terms of equation 1 in the paper's order (w1..w7)."""

SCALES: Final[dict[str, str]] = {
    "usage": "(Target - Usage + 1) / 2, both as shares of the cluster in 0..1",
    "queue_time": "min(Qtime / max_queue_time_s, 1)",
    "os_available": "((N_availableOS - N_reqOS) / N_nodes clipped to -1..1 + 1) / 2",
    "preempt_count": "min(Pn / max_preempt_count, 1)",
    "preempt_time": "min(Pt / max_preempt_time_s, 1)",
    "free_nodes": "((N_free - max(N_reqOS - N_availableOS, 0)) / N_nodes clipped to -1..1 + 1) / 2",
    "interactive": "1 for an interactive job within the interactive cap(s), else 0",
}
"""How each raw term becomes a number in 0..1 (shown by --explain and docs/priority.md)."""


def weight_vector(weights: PriorityWeights) -> tuple[float, ...]:
    """The weights in TERMS order."""
    return tuple(float(getattr(weights, name)) for name in TERMS)
