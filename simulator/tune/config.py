"""`[tune]`: what `vjob tune` searches, within which bounds, for which objectives.

Why a configuration section and not only options: `vjob config check` must refuse an inverted
range in vjob.toml before any study starts, with the key named (vjob.config.composed composes
this model into the one file).
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator

from vjob.config import PriorityWeights, SchedulingConfig, Section

TUNE_OBJECTIVES = (
    "interactive_response",
    "interactive_wait",
    "batch_response",
    "batch_slowdown",
    "large_batch_response",
    "admitted_interactive_wait",
    "utilization",
)
"""What a `vjob tune` trial can optimise (simulator/tune/space.py measures them)."""
TUNE_BOUNDS: dict[str, tuple[float, float]] = {
    **{name: (0.0, 0.5) for name in PriorityWeights.model_fields},
    "interactive_cap": (0.02, 0.5),
    "head_slack_s": (0.0, 7200.0),
    "max_preemptions": (0.0, 5.0),
    "interactive_reserve_nodes": (0.0, 32.0),
}
"""Tunable parameters and their built-in search ranges (the first value is also the floor)."""
TUNE_CHOICES: dict[str, tuple[str, ...]] = {
    "tier_order": get_args(SchedulingConfig.model_fields["tier_order"].annotation),
}
"""Tunable parameters that take one of a few values (Optuna's categorical), with those values:
`[scheduling] tier_order` decides whether the seven weights order anything under vjob."""

POLICY_PARAMS: dict[str, tuple[str, ...]] = {
    "vjob": (
        "tier_order",
        *PriorityWeights.model_fields,
        "interactive_cap",
        "head_slack_s",
        "max_preemptions",
        "interactive_reserve_nodes",
    ),
    "ubis": (*PriorityWeights.model_fields, "interactive_cap"),
}
"""What each tunable policy's pass reads, hence what a trial of it may set. Under vjob the
seven weights order a tier only as `tier_order` lets them (preemption/scheduling/tick.py
`_order`: "submit" none, "ubis-interactive" the interactive tier, "ubis" every tier), so a
vjob study searches `tier_order` with them: a search of the weights alone under the default
"submit" would measure seven parameters that change nothing. ubis ignores vjob's guard,
preemption bound, reserve and tier order."""


class TuneConfig(Section):
    """`vjob tune`: what is searched, within which bounds, for which objectives (docs/tune.md)."""

    objectives: list[Literal[TUNE_OBJECTIVES]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: ["interactive_response", "batch_slowdown"]
    )
    """What a trial measures on the training part of the trace: interactive_response,
    interactive_wait, batch_response, batch_slowdown, large_batch_response,
    admitted_interactive_wait (the cap-admitted interactive jobs' wait) (lowered) or
    utilization (raised)."""
    policy: Literal["ubis", "vjob"] | None = None
    """The policy the trials replay and `vjob tune apply` writes; unset: the site's
    [scheduling] policy (vjob by default). The weights rank the whole queue under ubis, each
    tier under vjob."""
    sampler: Literal["nsga2", "tpe"] = "nsga2"
    """Optuna's sampler: NSGA-II (a genetic front) or multi-objective TPE (better with few trials)."""
    search: list[str] | None = None
    """Parameters searched; unset: all the policy reads (vjob: tier_order, the seven weights,
    interactive_cap, head_slack_s, max_preemptions, interactive_reserve_nodes; ubis: the seven
    weights and interactive_cap). The others keep their [priority] / [scheduling] values."""
    bounds: dict[str, tuple[float, float]] = Field(default_factory=dict)
    """Search range per parameter, [low, high]; parameters not listed use the built-in range
    (weights 0..0.5, interactive_cap 0.02..0.5, head_slack_s 0..7200, max_preemptions 0..5,
    interactive_reserve_nodes 0..32)."""
    train_fraction: float = Field(0.7, gt=0.05, lt=1)
    """Share of the trace's span (from its start) the trials replay; the rest is held back."""

    @field_validator("search")
    @classmethod
    def _search(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        for name in value:
            if name not in TUNE_BOUNDS and name not in TUNE_CHOICES:
                known = ", ".join([*TUNE_BOUNDS, *TUNE_CHOICES])
                raise ValueError(f"{name!r}: not a tunable parameter ({known})")
        if not value:
            raise ValueError("nothing to search: name at least one parameter")
        return value

    @field_validator("bounds")
    @classmethod
    def _bounds(cls, value: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
        for name, (low, high) in value.items():
            if name not in TUNE_BOUNDS:
                raise ValueError(f"{name!r}: not a tunable parameter ({', '.join(TUNE_BOUNDS)})")
            if not low < high:
                raise ValueError(f"{name} = [{low:g}, {high:g}]: bounds inverted or empty (need low < high)")
            if low < TUNE_BOUNDS[name][0]:
                raise ValueError(f"{name} = [{low:g}, {high:g}]: low must be >= {TUNE_BOUNDS[name][0]:g}")
        return value
