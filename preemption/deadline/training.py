"""The training phase: choose the static X, Δx, the target failure rate and the bounds that give
the best success rate on a training workload (the paper's 10,000 h), to use on the steady one.

Pure apart from the evaluator the caller passes (the simulator runs one replay per candidate).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vjob.errors import InputError


@dataclass(frozen=True, slots=True)
class TrainingResult:
    best: dict[str, Any]
    score: float
    tried: tuple[tuple[dict[str, Any], float], ...]

    def toml(self) -> str:
        """The [deadline] lines to paste into vjob.toml."""
        lines = ["[deadline]"]
        for key, value in sorted(self.best.items()):
            lines.append(f"{key} = {value!r}" if not isinstance(value, str) else f'{key} = "{value}"')
        return "\n".join(lines) + "\n"


def fit_training(
    evaluate: Callable[[dict[str, Any]], float],
    grid: Mapping[str, Sequence[Any]],
    *,
    valid: Callable[[dict[str, Any]], bool] | None = None,
) -> TrainingResult:
    """Try every combination of `grid` (skipping those `valid` refuses); keep the best score.

    Ties keep the first combination tried, so the grid's order states the preference (list the
    cautious values first)."""
    if not grid or any(len(v) == 0 for v in grid.values()):
        raise InputError(f"fit_training: grid = {dict(grid)!r}: every parameter needs at least one value")
    keys = list(grid)
    tried: list[tuple[dict[str, Any], float]] = []
    best: dict[str, Any] | None = None
    best_score = float("-inf")
    for values in itertools.product(*(grid[k] for k in keys)):
        params = dict(zip(keys, values, strict=True))
        if valid is not None and not valid(params):
            continue
        score = float(evaluate(params))
        tried.append((params, score))
        if score > best_score:
            best, best_score = params, score
    if best is None:
        raise InputError("fit_training: no valid combination in the grid")
    return TrainingResult(best=best, score=best_score, tried=tuple(tried))
