"""The JSON form of a plan (`vjob plan` prints it, `vjob plan --check PLAN.json` reads it), as a
pydantic model: its JSON Schema is what `vjob schema plan` prints.

Why a model beside `Plan.from_dict`: the schema is the documentation an operator or another
tool writes plans against; `PlanInput.parse` validates types and bounds with errors naming the
field path, before `Plan.from_dict` builds the plan (and `validate` checks it against an
instance). One action is one object whose keys depend on its kind (see docs/planner.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from vjob.json_input import MAX_ITEMS, InputModel, Name, validate


class ActionInput(InputModel):
    """One action of a pool. run: `on`; stop and suspend: `on` (the VM's node); resume: `on`
    (destination) and `from` (where the state lies; null or equal to `on` for a local
    resume); migrate: `from` and `to`."""

    model_config = InputModel.model_config | {"populate_by_name": True}

    action: Literal["run", "stop", "suspend", "resume", "migrate"]
    vm: Name
    vjob: str = Field("", max_length=256)
    on: Name | None = None
    from_: Name | None = Field(None, alias="from")
    to: Name | None = None


class PlanInput(InputModel):
    """A context-switch plan: pools run one after the other, the actions of a pool in parallel."""

    pools: list[list[ActionInput]] = Field(max_length=MAX_ITEMS)
    placement: dict[Name, Name] = Field({}, max_length=MAX_ITEMS)
    """VM → node of every VM running at the end."""
    cost: int = Field(0, ge=0)
    """Σ over actions of (cost of the pools before it + its own cost), in MB (Entropy)."""
    optimizer: str = Field("", max_length=64)
    warnings: list[str] = Field([], max_length=1000)
    stats: dict[str, Any] = Field({}, max_length=1000)

    @classmethod
    def parse(cls, data: Any, source: str) -> PlanInput:
        return validate(cls, data, source)


__all__ = ["ActionInput", "PlanInput"]
