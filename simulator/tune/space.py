"""The search space and the objectives of `vjob tune`, from [tune] and the command line.

Why the bounds live in simulator.tune.config (TUNE_BOUNDS) and not here: `vjob config check` must
refuse an inverted range in vjob.toml before any study starts, with the key named.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from simulator.tune.config import POLICY_PARAMS, TUNE_BOUNDS, TUNE_CHOICES, TUNE_OBJECTIVES, TuneConfig
from vjob.config import PriorityConfig, PriorityWeights, SchedulingConfig
from vjob.errors import InputError

WEIGHTS = tuple(PriorityWeights.model_fields)
"""w1..w7 in the paper's order, named as in [priority.weights]."""
INTEGERS = frozenset({"max_preemptions", "interactive_reserve_nodes"})
SCHEDULING = frozenset({"head_slack_s", "max_preemptions", "interactive_reserve_nodes", "tier_order"})
"""Parameters that live in [scheduling] (the others in [priority])."""

MAXIMISED = frozenset({"utilization"})


def weight_name(text: str) -> str:
    """`w3` or `os_available` → `os_available`: the paper's numbering or the config's names."""
    key = text.strip()
    m = re.fullmatch(r"w([1-7])", key)
    if m:
        return WEIGHTS[int(m.group(1)) - 1]
    if key in WEIGHTS:
        return key
    raise InputError(f"weight {key[:40]!r}: not a UBIS weight (w1..w7 or {', '.join(WEIGHTS)})")


def objectives(text: str | None, cfg: TuneConfig) -> list[str]:
    """--objectives (comma list) or [tune] objectives, checked, without repeats."""
    names = [n.strip() for n in text.split(",")] if text is not None else list(cfg.objectives)
    for name in names:
        if name not in TUNE_OBJECTIVES:
            raise InputError(f"--objectives: unknown objective {name[:40]!r} (known: {', '.join(TUNE_OBJECTIVES)})")
    if not names or len(set(names)) != len(names):
        raise InputError(f"--objectives = {text!r}: name each objective once, at least one")
    return names


def directions(names: list[str]) -> list[str]:
    return ["maximize" if n in MAXIMISED else "minimize" for n in names]


@dataclass(frozen=True)
class Space:
    """The parameters searched: numbers with their [low, high] ranges, and (`choices`) the
    ones that take one of a few values (TUNE_CHOICES)."""

    bounds: dict[str, tuple[float, float]]
    choices: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def suggest(self, trial: Any) -> dict[str, float | str]:
        """One point of the space, asked of an Optuna trial."""
        out: dict[str, float | str] = {}
        for name, options in self.choices.items():
            out[name] = trial.suggest_categorical(name, list(options))
        for name, (low, high) in self.bounds.items():
            if name in INTEGERS:
                out[name] = float(trial.suggest_int(name, int(low), int(high)))
            else:
                out[name] = trial.suggest_float(name, low, high)
        return out

    @property
    def names(self) -> list[str]:
        """Every parameter searched, the chosen-among ones first."""
        return [*self.choices, *self.bounds]


def tuned_policy(given: str | None, cfg_policy: str | None, site_policy: str) -> str:
    """--policy, else [tune] policy, else the site's [scheduling] policy: the one tuned."""
    name = given or cfg_policy or site_policy
    if name not in POLICY_PARAMS:
        where = "--policy" if given else "[tune] policy" if cfg_policy else "[scheduling] policy"
        raise InputError(
            f"{where} = {name!r}: vjob tune tunes {' or '.join(POLICY_PARAMS)} (pass --policy to pick one)"
        )
    return name


def space(search: str | None, bounds: str | None, cfg: TuneConfig, policy: str = "ubis") -> Space:
    """--search / --bounds (flags) over [tune] search / bounds over the built-in ranges; by
    default every parameter `policy` reads, and only those (POLICY_PARAMS).

    --bounds is `name=low:high,...`; a weight may be named w1..w7.
    """
    if search is not None:
        names = [_param(n) for n in search.split(",")]
    else:
        names = list(cfg.search) if cfg.search is not None else list(POLICY_PARAMS[policy])
    if not names:
        raise InputError("--search: name at least one parameter")
    for name in names:
        if name not in POLICY_PARAMS[policy]:
            raise InputError(
                f"--search {name}: the {policy} policy does not read it, so it would change nothing "
                f"(it reads {', '.join(POLICY_PARAMS[policy])})"
            )
    ranges = {name: tuple(TUNE_BOUNDS[name]) for name in TUNE_BOUNDS} | {k: tuple(v) for k, v in cfg.bounds.items()}
    names = list(dict.fromkeys(names))
    for part in (bounds or "").split(","):
        if not part.strip():
            continue
        m = re.fullmatch(r"\s*([A-Za-z0-9_]+)\s*=\s*([-+0-9.eE]+)\s*:\s*([-+0-9.eE]+)\s*", part)
        if not m:
            raise InputError(f"--bounds {part[:60]!r}: expected name=low:high")
        name = _param(m.group(1))
        if name in TUNE_CHOICES:
            raise InputError(f"--bounds {name}: takes one of {', '.join(TUNE_CHOICES[name])}, not a range")
        try:
            low, high = float(m.group(2)), float(m.group(3))
        except ValueError:
            raise InputError(f"--bounds {part[:60]!r}: low and high must be numbers") from None
        if not (math.isfinite(low) and math.isfinite(high)) or not low < high:
            raise InputError(f"--bounds {name}={low:g}:{high:g}: bounds inverted or empty (need low < high)")
        if low < TUNE_BOUNDS[name][0]:
            raise InputError(f"--bounds {name}={low:g}:{high:g}: low must be >= {TUNE_BOUNDS[name][0]:g}")
        ranges[name] = (low, high)
    return Space(
        {name: (float(ranges[name][0]), float(ranges[name][1])) for name in names if name not in TUNE_CHOICES},
        {name: TUNE_CHOICES[name] for name in names if name in TUNE_CHOICES},
    )


def _param(text: str) -> str:
    key = text.strip()
    if re.fullmatch(r"w[1-7]", key):
        return weight_name(key)
    if key not in TUNE_BOUNDS and key not in TUNE_CHOICES:
        known = ", ".join([*TUNE_BOUNDS, *TUNE_CHOICES])
        raise InputError(f"parameter {key[:40]!r}: not tunable (known: w1..w7, {known})")
    return key


def configs(
    params: dict[str, float | str], priority: dict[str, Any], scheduling: dict[str, Any]
) -> tuple[PriorityConfig, SchedulingConfig]:
    """The [priority] and [scheduling] a point of the space stands for (others as given)."""
    prio = dict(priority)
    prio["weights"] = dict(prio.get("weights", {})) | {k: v for k, v in params.items() if k in WEIGHTS}
    if "interactive_cap" in params:
        prio["interactive_cap"] = params["interactive_cap"]
    sched = dict(scheduling)
    for name in SCHEDULING & params.keys():
        sched[name] = int(params[name]) if name in INTEGERS else params[name]
    return PriorityConfig.model_validate(prio), SchedulingConfig.model_validate(sched)


def measure(doc: dict[str, Any], name: str) -> float:
    """Objective `name` from a run's summary (metrics.summary); NaN when the run has no such
    jobs (then Optuna records the trial as failed rather than as a good score)."""
    value: Any
    if name == "utilization":
        value = doc.get("utilization")
    elif name == "admitted_interactive_wait":
        value = (doc.get("interactive_admitted") or {}).get("mean_wait_s")
    elif name == "large_batch_response":
        value = doc.get("batch_by_size", {}).get("large", {}).get("mean_response_s")
    else:
        cls, what = name.split("_", 1)
        key = {"response": "mean_response_s", "wait": "mean_wait_s", "slowdown": "mean_bounded_slowdown"}[what]
        value = doc["by_class"].get(cls, {}).get(key)
    return float(value) if value is not None else math.nan


def weight_variants(options: list[str]) -> list[dict[str, float]]:
    """`--weight w3=0.05,0.1,0.2 --weight w7=0.2,0.3` → every combination, as
    [priority.weights] overrides ([{}] with no option): `vjob simulate --sweep` varies them."""
    axes: dict[str, list[float]] = {}
    for option in options:
        m = re.fullmatch(r"\s*([A-Za-z0-9_]+)\s*=\s*(.+)", option)
        if not m:
            raise InputError(f"--weight {option[:60]!r}: expected NAME=V[,V...] (e.g. w3=0.05,0.1,0.2)")
        name = weight_name(m.group(1))
        values = []
        for part in m.group(2).split(","):
            try:
                v = float(part)
            except ValueError:
                raise InputError(f"--weight {name} = {part.strip()[:30]!r}: not a number") from None
            if not (v >= 0 and math.isfinite(v)):
                raise InputError(f"--weight {name} = {v:g}: must be a finite number >= 0")
            values.append(v)
        if name in axes:
            raise InputError(f"--weight {name}: given twice")
        axes[name] = values
    combos: list[dict[str, float]] = [{}]
    for name, values in axes.items():
        combos = [c | {name: v} for c in combos for v in values]
    return combos


def weights_label(weights: dict[str, float]) -> str:
    """`w3=0.05 w7=0.3`: a sweep cell's weights, in the paper's numbering ("" = as configured)."""
    return " ".join(
        f"w{WEIGHTS.index(k) + 1}={v:g}" for k, v in sorted(weights.items(), key=lambda kv: WEIGHTS.index(kv[0]))
    )
