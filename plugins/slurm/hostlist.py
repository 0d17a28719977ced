"""Slurm host lists (`node[1-3,7]`, `o[0002-0006]`, `rack[1-2]-n[1-2]`) expanded to names.

Why our own: the adapter must turn `NodeList=` / `nodes` into the node names a ClusterView
holds, and `scontrol show hostnames` would be one more command per job per observation.
"""

from __future__ import annotations

from vjob.errors import InputError

MAX_HOSTS = 100_000


def expand(hostlist: str) -> tuple[str, ...]:
    """Every host name in `hostlist`, in order; InputError naming the list when malformed."""
    text = (hostlist or "").strip()
    if text in ("", "(null)", "None", "N/A"):
        return ()
    out: list[str] = []
    for item in _split_top(text, hostlist):
        out.extend(_expand_one(item, hostlist))
        if len(out) > MAX_HOSTS:
            raise InputError(f"host list {hostlist!r}: more than {MAX_HOSTS} hosts")
    return tuple(out)


def _split_top(text: str, whole: str) -> list[str]:
    """Split at commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InputError(f"host list {whole!r}: unbalanced ']'")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise InputError(f"host list {whole!r}: unbalanced '['")
    items.append(text[start:])
    return [i.strip() for i in items if i.strip()]


def _expand_one(item: str, whole: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    prefix, ranges, rest = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    tails = _expand_one(rest, whole) if rest else [""]
    names = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise InputError(f"host list {whole!r}: bad range {part!r} (expected N or N-M)")
        first, last = int(lo), int(hi) if hi else int(lo)
        if last < first:
            raise InputError(f"host list {whole!r}: range {part!r} runs backwards")
        width = len(lo) if lo.startswith("0") else 0
        for number in range(first, last + 1):
            for tail in tails:
                names.append(f"{prefix}{number:0{width}d}{tail}")
    return names
