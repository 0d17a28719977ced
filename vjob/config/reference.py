"""`vjob config reference`: the Markdown page of every section and key, read from the models.

Why from the models: docs/configuration.md is this text and a test keeps it equal to the code,
so a key cannot be added, bounded or explained in one place only. The sections owned beside
their code (vjob.config.composed) are read from their owners' models like the kernel's.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any, Literal

from pydantic import BaseModel

from vjob.config.composed import SECTION_OWNERS, Config, owned_section


def reference() -> str:
    """The Markdown reference of every key (docs/configuration.md is this text; a test checks it)."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from the configuration models by `vjob config reference`; a test keeps this page",
        "equal to the code. The file is TOML: `/etc/vjob/vjob.toml`, or `--config FILE`, or",
        "`$VJOB_CONFIG`. Every key is optional; unknown keys are errors.",
        "",
        "`vjob config show` and every message naming a URL mask its secrets: the password of",
        "`user:password@host` (up to the last `@` before the host, so a raw `@` in it is masked",
        "too) and query parameters named like `password`, `passwd`, `pass`, `secret`, `token`,",
        '`key` (any case). See docs/security.md, "Secrets and the store".',
        "",
    ]
    _reference_section(Config, "", lines)
    return "\n".join(lines).rstrip() + "\n"


def _reference_section(model: type[BaseModel], prefix: str, lines: list[str]) -> None:
    nested: list[tuple[str, type[BaseModel], bool]] = []
    rows: list[str] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if model is Config and name in SECTION_OWNERS:
            nested.append((name, owned_section(name), False))
            continue
        sub = _model_of(ann)
        if sub is not None:
            nested.append((name, sub, ann is not sub))
            continue
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        shown = "(required)" if field.is_required() else "(unset)" if default is None else f"`{_short(default)}`"
        limits = ", ".join(
            f"{op} {getattr(m, attr)}"
            for m in field.metadata
            for attr, op in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))
            if getattr(m, attr, None) is not None
        )
        desc = " ".join((field.description or _attribute_docs(model).get(name, "")).split())
        rows.append(f"| `{name}` | {_type_name(ann)} | {shown} | {limits} | {desc} |")
    if rows:
        lines += [f"## `[{prefix}]`" if prefix else "## top level", ""]
        doc = " ".join((model.__doc__ or "").split()) if model is not Config else ""
        if doc and not doc.startswith("Base of") and not doc.startswith("!!!"):
            lines += [doc, ""]
        lines += ["| key | type | default | limits | meaning |", "|---|---|---|---|---|", *rows, ""]
    for name, sub, is_list in nested:
        key = f"{prefix}.{name}" if prefix else name
        _reference_section(sub, f"[{key}]" if is_list else key, lines)


def _attribute_docs(model: type[BaseModel]) -> dict[str, str]:
    """The string under each field of `model` and its bases, read from their source."""
    docs: dict[str, str] = {}
    for cls in reversed([c for c in model.__mro__ if issubclass(c, BaseModel) and c is not BaseModel]):
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
        assert isinstance(body, ast.ClassDef)
        for stmt, after in zip(body.body, body.body[1:], strict=False):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[stmt.target.id] = after.value.value
    return docs


def _model_of(ann: Any) -> type[BaseModel] | None:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _type_name(ann: Any) -> str:
    if getattr(ann, "__origin__", None) is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in ann.__args__)
    text = getattr(ann, "__name__", None) if isinstance(ann, type) else None
    return (text or str(ann).replace("typing.", "")).replace("|", "or")


def _short(value: Any) -> str:
    if isinstance(value, str):
        return repr(value) if value else '""'
    return repr(value)
