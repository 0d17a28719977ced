"""JSON inputs through pydantic: one way to validate a file a user hands to vjob.

Why: cluster views (`vjob prio --from`), planner instances and plans (`vjob plan`) used to be
checked by hand, each with its own rules and messages. A pydantic model per input gives typed
checks with size limits, errors that name the field path (`view.jobs[3].nodes`), and the JSON
Schema `vjob schema NAME` prints for the docs — from one declaration. Inputs may come from a
hostile user: strings and lists are bounded, unknown keys are errors, numbers are finite.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vjob.errors import InputError

MAX_NAME = 256
"""Longest identifier (job, node, VM, user, image) accepted from a file."""
MAX_ITEMS = 1_000_000
"""Most entries of one list (jobs, nodes, VMs) accepted from a file."""

Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME)]
"""A non-empty identifier of bounded length."""
Count = Annotated[int, Field(ge=0)]
Seconds = Annotated[float, Field(allow_inf_nan=False)]
"""POSIX seconds or a duration: finite."""


class InputModel(BaseModel):
    """Base of every JSON input model: unknown keys are errors, types are strict (no "3" for
    3, no 1.5 for an integer), and the docstrings of fields become the schema's descriptions."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True)


M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], data: Any, source: str) -> M:
    """`data` (parsed JSON) as `model`; an InputError naming `source`, the field path, the
    value (shortened) and what is allowed, for the first few errors."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InputError(describe(exc, source, model)) from None


def describe(exc: ValidationError, source: str, model: type[BaseModel] | None = None, limit: int = 3) -> str:
    errors = exc.errors(include_url=False)
    parts = []
    for err in errors[:limit]:
        loc = err["loc"]
        path = source + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
        value = repr(err.get("input"))
        value = value if len(value) <= 60 else value[:57] + "..."
        if err["type"] == "missing":
            parent = source + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[:-1])
            parts.append(f"{parent}: missing key {str(loc[-1])!r}")
        elif err["type"] == "extra_forbidden":
            parts.append(f"{path}: unknown {'top-level ' if len(loc) == 1 else ''}key")
        else:
            parts.append(f"{path} = {value}: {_rule(err, model)}")
    more = f" (and {len(errors) - limit} more)" if len(errors) > limit else ""
    return "; ".join(parts) + more


_RULES = {
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}",
    "less_than": "must be < {lt}",
    "too_long": "too long (at most {max_length})",
    "string_too_long": "too long (at most {max_length} characters)",
    "string_too_short": "must not be empty",
    "finite_number": "must be a finite number",
    "literal_error": "must be one of {expected}",
}


def _rule(err: Any, model: type[BaseModel] | None) -> str:
    """What is allowed, in the project's words where pydantic's are long-winded."""
    kind = err["type"]
    if kind == "literal_error":
        return "must be one of " + str(err["ctx"]["expected"]).replace("'", "").replace(" or ", ", ")
    if kind in ("int_type", "int_from_float", "float_type", "finite_number"):
        noun = "an integer" if kind.startswith("int") else "a finite number"
        return f"must be {noun}{_bounds(model, err['loc'])}"
    template = _RULES.get(kind)
    try:
        return template.format(**err.get("ctx", {})) if template else str(err["msg"])
    except (KeyError, IndexError):
        return str(err["msg"])


def _bounds(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> str:
    """ " >= 1"-style bounds of the field at `loc` (model fields only; "" when unknown)."""
    field = None
    current: Any = model
    for part in loc:
        if isinstance(part, int) or not (isinstance(current, type) and issubclass(current, BaseModel)):
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            return ""
        args = [a for a in get_args(field.annotation) if isinstance(a, type)]
        current = args[-1] if args else field.annotation
    if field is None:
        return ""
    out = []
    for meta in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(meta, attr, None) is not None:
                out.append(f" {sign} {getattr(meta, attr)}")
    return "".join(out)


def load_json(text: str, source: str) -> Any:
    """Parse JSON text; not-JSON is an InputError with the line and column."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise InputError(f"{source}: not valid JSON: nested too deep") from None


def schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of an input model, as `vjob schema` prints it."""
    out = model.model_json_schema(mode="validation")
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return out


__all__ = ["MAX_ITEMS", "MAX_NAME", "Count", "InputModel", "Name", "Seconds", "describe", "load_json", "schema"]
