"""`vjob tune apply`: the chosen values written into vjob.toml, every other line kept as it was.

Why line-level editing: no TOML editor that keeps comments (tomlkit) is installed with vjob,
and an operator's file is mostly comments. Only `key = number` lines (and `[scheduling]
policy`) are touched, or added at the end of their section (the section at the end of the
file); the result is parsed, read back, and loaded by vjob's own loader (`vjob.config.load`,
what the agent runs) from the temporary file before that replaces the file.
"""

from __future__ import annotations

import os
import re
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from vjob import config as vconfig
from vjob.errors import ConfigError, InputError

_HEADER = re.compile(r"\s*\[\s*([A-Za-z0-9_.\- ]+?)\s*\]\s*(?:#.*)?")
_ARRAY_HEADER = re.compile(r"\s*\[\[")


def _key_line(key: str) -> re.Pattern[str]:
    dotted = r"\s*\.\s*".join(re.escape(p) for p in key.split("."))
    return re.compile(rf"(\s*{dotted}\s*=\s*)([^#]*?)(\s*(?:#.*)?)")


Value = float | int | str


def _literal(value: Value) -> str:
    """`value` as TOML: a number, or a basic string (only the policy names are written)."""
    if isinstance(value, str):
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", value):
            raise InputError(f"{value[:40]!r}: not a name vjob tune writes")
        return f'"{value}"'
    return repr(value) if isinstance(value, int) else repr(float(f"{value:.6g}"))


def set_values(text: str, updates: list[tuple[str, str, Value]]) -> str:
    """`text` with `key = value` set in `[section]` for each (section, key, value)."""
    lines = text.splitlines()
    for section, key, value in updates:
        lines = _set(lines, section, key, _literal(value))
    return "\n".join(lines) + "\n"


def _sections(lines: list[str]) -> list[str | None]:
    """The table each line belongs to ("" before any header, None inside an array of tables)."""
    out: list[str | None] = []
    current: str | None = ""
    for line in lines:
        m = _HEADER.fullmatch(line)
        if _ARRAY_HEADER.match(line):
            current = None
        elif m:
            current = re.sub(r"\s*\.\s*", ".", m.group(1))
        out.append(current)
    return out


def _set(lines: list[str], section: str, key: str, literal: str) -> list[str]:
    owner = _sections(lines)
    parts = section.split(".")
    # the key as written under its own table, or dotted under a parent table, or at the top
    forms = [(".".join(parts[:i]), ".".join([*parts[i:], key])) for i in range(len(parts), -1, -1)]
    for table, dotted in forms:
        pattern = _key_line(dotted)
        for i, line in enumerate(lines):
            if owner[i] != table or _HEADER.fullmatch(line):
                continue
            m = pattern.fullmatch(line)
            if m:
                lines[i] = f"{m.group(1)}{literal}{m.group(3)}"
                return lines
    for i, line in enumerate(lines):  # an inline table holding the key: too risky to edit here
        for table, dotted in forms[1:]:
            head = dotted.split(".")[0]
            if owner[i] == table and re.match(rf"\s*{re.escape(head)}\s*=\s*\{{", line):
                raise InputError(
                    f"{section}.{key}: written as an inline table on line {i + 1} ({line.strip()[:50]}); "
                    f"edit it by hand to {key} = {literal}"
                )
    for table, dotted in forms[1:]:  # siblings written as dotted keys: add it the same way
        prefix = dotted.rsplit(".", 1)[0]
        head = re.compile(r"\s*" + r"\s*\.\s*".join(re.escape(p) for p in prefix.split(".")) + r"\s*\.")
        siblings = [i for i, line in enumerate(lines) if owner[i] == table and head.match(line)]
        if siblings:
            return [*lines[: siblings[-1] + 1], f"{dotted} = {literal}", *lines[siblings[-1] + 1 :]]
    headers = [i for i, line in enumerate(lines) if owner[i] == section and _HEADER.fullmatch(line)]
    if not headers:
        return [*lines, *([""] if lines and lines[-1].strip() else []), f"[{section}]", f"{key} = {literal}"]
    at = headers[0]
    last = at
    for i in range(at + 1, len(lines)):
        if owner[i] != section:
            break
        if lines[i].strip() and not lines[i].lstrip().startswith("#"):
            last = i
    return [*lines[: last + 1], f"{key} = {literal}", *lines[last + 1 :]]


def _read_back(data: dict[str, Any], section: str, key: str) -> Any:
    node: Any = data
    for part in [*section.split("."), key]:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _same(got: Any, value: Value) -> bool:
    if isinstance(value, str) or isinstance(got, str) or got is None:
        return got == value
    return abs(float(got) - float(value)) <= 1e-6 * max(1.0, abs(float(value)))


def apply_file(path: Path, updates: list[tuple[str, str, Value]]) -> str:
    """Write `updates` into the file at `path` (created when missing), validated; returns the
    new text. The file is replaced atomically and keeps its mode."""
    try:
        old = path.read_text() if path.exists() else ""
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--config {path}: cannot read: {exc}") from None
    try:
        vconfig.parse(tomllib.loads(old), source=str(path))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML before any change: {exc}") from None
    new = set_values(old, updates)
    try:
        data = tomllib.loads(new)
    except tomllib.TOMLDecodeError as exc:  # the edit broke the file: refuse, keep the old one
        raise ConfigError(f"{path}: the edited file would not parse ({exc}); nothing written") from None
    vconfig.parse(data, source=f"{path} (edited)")
    for section, key, value in updates:
        got = _read_back(data, section, key)
        if not _same(got, value):
            raise ConfigError(f"{path}: {section}.{key} reads back as {got!r}, not {value!r}; nothing written")
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(new)
        os.chmod(tmp, mode)
        vconfig.load(tmp)  # the file as the agent will read it
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return new
