"""Reading the configuration file's bytes as TOML, every failure a ConfigError naming the file."""

from __future__ import annotations

import re
import sys
import tomllib
from typing import Any

from vjob.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20
"""A configuration file is a few kilobytes; anything this large is a mistake, not a setting."""
_LONG_NUMBER = re.compile(r"[0-9_]{4000,}")


def parse_toml(raw: bytes, source: str) -> dict[str, Any]:
    """TOML bytes to a mapping; every way tomllib can fail is a ConfigError naming `source`.

    Why more than TOMLDecodeError: tomllib also raises ValueError for an integer longer than
    Python's int conversion limit (4300 digits) and RecursionError for arrays or inline tables
    nested a thousand deep, and bytes that are not UTF-8 are a UnicodeDecodeError. Each gets the
    file and, where it can be found, the line.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{source}:{line}: not valid TOML: byte {raw[exc.start]:#04x} is not UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    except ValueError:  # int() over its digit limit, inside tomllib
        limit = sys.get_int_max_str_digits()
        found = _LONG_NUMBER.search(text)
        if found is None:
            raise ConfigError(f"{source}: not valid TOML: a number longer than {limit} digits") from None
        line = text.count("\n", 0, found.start()) + 1
        key = _key_of_line(text, found.start())
        raise ConfigError(
            f"{source}:{line}: not valid TOML: {key}a number of {len(found.group())} digits (at most {limit})"
        ) from None
    except RecursionError:
        raise ConfigError(f"{source}: not valid TOML: arrays or inline tables nested too deeply") from None


def _key_of_line(text: str, pos: int) -> str:
    """The "key 'name': " prefix for the line holding `pos` ("" when the line has no key)."""
    start = text.rfind("\n", 0, pos) + 1
    key, sep, _ = text[start:pos].partition("=")
    return f"key {key.strip()[:60]!r}: " if sep and key.strip() else ""
