"""Slurm host lists (`node[1-3,7]`, `o[0002-0006]`, `rack[1-2]-n[1-2]`) expanded to names.

Why our own: the adapter must turn `NodeList=` / `nodes` into the node names a ClusterView
holds, and `scontrol show hostnames` would be one more command per job per observation.
Why count first: a list is text a hostile output could make `n[0-3000000]`; the number of
names is computed from the ranges and refused above MAX_HOSTS before one name is built.
"""

from __future__ import annotations

import re

from vjob.errors import InputError

MAX_HOSTS = 100_000
MAX_CHARS = 65_536
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A Slurm node name as vjob accepts it (also what `scontrol update ReqNodeList=` receives)."""
_RANGE = re.compile(r"([0-9]{1,10})(?:-([0-9]{1,10}))?")
_PIECE = re.compile(r"[A-Za-z0-9._-]*")


def expand(hostlist: str, where: str = "") -> tuple[str, ...]:
    """Every host name in `hostlist`, in order; InputError naming `where` and the list when malformed."""
    if where:
        try:
            return expand(hostlist)
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
    text = (hostlist or "").strip()
    if text in ("", "(null)", "None", "N/A"):
        return ()
    if len(text) > MAX_CHARS:
        raise InputError(f"host list {text[:40]!r}...: longer than {MAX_CHARS} characters")
    items = _split_top(text, hostlist)
    parsed = [_parse(item, hostlist) for item in items]
    total = sum(_count(p) for p in parsed)
    if total > MAX_HOSTS:
        raise InputError(f"host list {hostlist[:60]!r}: {total} hosts, more than {MAX_HOSTS}")
    out: list[str] = []
    for p in parsed:
        out.extend(_names(p))
    bad = next((n for n in out if not NODE_NAME.fullmatch(n)), None)
    if bad is not None:
        raise InputError(f"host list {hostlist[:60]!r}: {bad[:70]!r} is not a node name")
    return tuple(out)


def _split_top(text: str, whole: str) -> list[str]:
    """Split at commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise InputError(f"host list {whole[:60]!r}: nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InputError(f"host list {whole[:60]!r}: unbalanced ']'")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise InputError(f"host list {whole[:60]!r}: unbalanced '['")
    items.append(text[start:])
    return [i.strip() for i in items if i.strip()]


# One item as a sequence of parts: a literal piece, or a list of (first, last, width) ranges.
_Part = str | list[tuple[int, int, int]]


def _parse(item: str, whole: str) -> list[_Part]:
    parts: list[_Part] = []
    rest = item
    while rest:
        open_at = rest.find("[")
        piece = rest if open_at < 0 else rest[:open_at]
        if not _PIECE.fullmatch(piece):
            raise InputError(f"host list {whole[:60]!r}: {piece[:40]!r} is not part of a node name")
        if piece:
            parts.append(piece)
        if open_at < 0:
            break
        close_at = rest.index("]", open_at)  # balanced and not nested: _split_top checked
        parts.append(_ranges(rest[open_at + 1 : close_at], whole))
        rest = rest[close_at + 1 :]
    return parts


def _ranges(spec: str, whole: str) -> list[tuple[int, int, int]]:
    out = []
    for part in spec.split(","):
        match = _RANGE.fullmatch(part.strip())
        if not match:
            raise InputError(f"host list {whole[:60]!r}: bad range {part[:20]!r} (expected N or N-M)")
        lo, hi = match.group(1), match.group(2)
        first, last = int(lo), int(hi) if hi is not None else int(lo)
        if last < first:
            raise InputError(f"host list {whole[:60]!r}: range {part[:20]!r} runs backwards")
        out.append((first, last, len(lo) if lo.startswith("0") else 0))
    return out


def _count(parts: list[_Part]) -> int:
    total = 1
    for part in parts:
        if not isinstance(part, str):
            total *= sum(last - first + 1 for first, last, _ in part)
            if total > MAX_HOSTS:  # stop multiplying early: the caller refuses it anyway
                return total
    return total


def _names(parts: list[_Part]) -> list[str]:
    names = [""]
    for part in parts:
        if isinstance(part, str):
            names = [n + part for n in names]
        else:
            names = [f"{n}{k:0{w}d}" for n in names for first, last, w in part for k in range(first, last + 1)]
    return names
