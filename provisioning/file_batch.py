"""Several files of one node asked about, or removed, in one ssh round trip.

Why: each remote file operation is an ssh session (through a shared master still a process on
both ends, a few tenths of a second on a loaded node), and a saved VM's move asked one at a
time about its state, overlay, job disk and two logs, for their existence and their size
(the copies' timeouts), then hashed each copy on arrival and removed the source's files one
by one. One script now answers for all of them: the size of each file, and its sha256 where
asked, computed where the files are (a copy is judged by the bytes that arrived, never through
a local path). An image's files on a node (`image_files.check`) are asked the same way.
"""

from __future__ import annotations

import re
from pathlib import Path

from provisioning import transfer
from vjob.errors import VjobError

FOUND_SCRIPT = (
    'for f; do h=${f%%:*}; f=${f#*:}; if [ ! -e "$f" ]; then echo -; '
    'elif [ "$h" = 1 ]; then echo "$(stat -L -c %s -- "$f") $(sha256sum -- "$f" | cut -d" " -f1)"; '
    'else echo "$(stat -L -c %s -- "$f") -"; fi; done'
)
"""Per argument `<0|1>:<path>`, one line: "-" when absent, else "<size> <sha256>" (1) or "<size> -" (0)."""
_LINE_RE = re.compile(r"([0-9]{1,20}) (-|[0-9a-f]{64})")


def found(
    host: str | None, files: list[tuple[Path, bool]], *, timeout_s: float = 600.0
) -> list[tuple[int, str] | None]:
    """Size and (when its flag is set) sha256 of each file on `host` (None: this machine), None
    for a missing one, "" for a sha256 not asked; in one ssh round trip for another host."""
    if host is None:
        out: list[tuple[int, str] | None] = []
        for path, hashed in files:
            try:
                n = path.stat().st_size
            except FileNotFoundError:
                out.append(None)
                continue
            out.append((n, transfer.sha256_file(path) if hashed else ""))
        return out
    if not files:
        return []
    args = [f"{int(hashed)}:{path}" for path, hashed in files]
    answer = transfer.run_on(host, ["sh", "-c", FOUND_SCRIPT, "sh", *args], timeout_s=timeout_s).splitlines()
    if len(answer) != len(files):
        raise VjobError(f"files on {host}: unexpected answer {' | '.join(answer)[:160]!r}")
    parsed: list[tuple[int, str] | None] = []
    for line, (path, hashed) in zip(answer, files, strict=True):
        if line.strip() == "-":
            parsed.append(None)
            continue
        m = _LINE_RE.fullmatch(line.strip())
        if m is None or (hashed and m.group(2) == "-"):
            raise VjobError(f"file {host}:{path}: unexpected answer {line[:160]!r}")
        parsed.append((int(m.group(1)), "" if m.group(2) == "-" else m.group(2)))
    return parsed


def remove_all(host: str | None, paths: list[Path], *, timeout_s: float = 60.0) -> None:
    """Delete files of one node (one `rm -f` for another host); files already gone are fine."""
    if host is None:
        for path in paths:
            path.unlink(missing_ok=True)
        return
    if paths:
        transfer.run_on(host, ["rm", "-f", "--", *map(str, paths)], timeout_s=timeout_s)
