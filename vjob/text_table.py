"""Tables as plain text: aligned columns with full headers, or one block per row when they do
not fit the terminal.

Why not rich's tables: rich fits a wide table into the terminal by shrinking its columns, so
thirteen columns in 80 cut the headers to two letters, and in a pipe it still draws boxes that
`grep`/`awk` must step around. Here a header is never cut: in a pipe (no width) the columns are
aligned at whatever width they need; on a terminal too narrow for them each row becomes a block
of `header: value` lines, the values wrapped to the width.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Sequence
from typing import TextIO

GAP = "  "


def terminal_width(stream: TextIO | None = None) -> int | None:
    """The width to fit: the terminal's ($COLUMNS first) when `stream` is one, else None
    (a pipe or a file: no limit, one line per row)."""
    stream = stream or sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return shutil.get_terminal_size().columns if tty else None


def _flat(cell: object) -> str:
    """A cell on one line: a value of several lines (the VMs of a multi-node vjob) is joined,
    an empty one shows as `-` (an empty column reads as a shifted one)."""
    return ", ".join(str(cell).splitlines()) or "-" if cell is not None else "-"


def render(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]], width: int | None) -> str:
    """`title`, then the table: aligned when it fits in `width` (None: always), else blocks."""
    cells = [[_flat(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    out = [title]
    if not cells:
        return f"{title}: none\n"
    if width is None or sum(widths) + len(GAP) * (len(widths) - 1) <= width:
        for line in [list(headers), *cells]:
            out.append(GAP.join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
        return "\n".join(out) + "\n"
    key_w = max(len(h) for h in headers) + 1
    value_w = max(20, width - key_w - len(GAP))
    for n, row in enumerate(cells, 1):
        out.append(f"[{n}/{len(cells)}]")
        for head, value in zip(headers, row, strict=True):
            lines = textwrap.wrap(value, value_w, break_long_words=True, break_on_hyphens=False) or [""]
            out.append(f"{head + ':':<{key_w}}{GAP}{lines[0]}")
            out.extend(" " * (key_w + len(GAP)) + more for more in lines[1:])
    return "\n".join(out) + "\n"
