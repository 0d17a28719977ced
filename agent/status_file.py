"""The small status records the agent's duties leave for `vjob status` in its data directory.

Why files and not the store or the agent's memory: `vjob status` must answer with the agent
stopped or the database down, and it reads the pilots and the store, never the agent's memory.
The data directory is root's (no user can race the write); the record is replaced whole (a
temporary file renamed over it), so a reader sees the last record or the one before, never
half of one. `agent.status_cmd` reads them back, a broken one as a warning.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_status_file(path: Path, doc: dict[str, Any]) -> None:
    """Replace the record at `path` with `doc` (JSON). Raises OSError: the caller logs it, a
    status record is never worth stopping a duty for."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc) + "\n")
    os.replace(tmp, path)


__all__ = ["write_status_file"]
