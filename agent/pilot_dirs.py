"""The pilot directories under the pilot root, listed each tick without making them again.

Why: at a site's size the root holds a directory per running vjob (19,000 in bench/agent_tick.py);
vjob.pilot_files.all_dirs makes a PilotDir (paths built by pathlib) and looks for its state file
for each one at every call, most of a tenth of a second there. Here the root is scanned (one
scandir) and the PilotDir objects of the last look are kept while its entries are the same;
whether a directory holds a state file is left to agent.observe.hear, which looks at that file
anyway.
"""

from __future__ import annotations

import os
from pathlib import Path

from vjob.errors import InputError
from vjob.pilot_files import PilotDir

_DIRS: dict[tuple[Path, str], tuple[frozenset[str], list[PilotDir]]] = {}


def pilot_dirs(root: Path, rms: str) -> list[PilotDir]:
    """Every plain directory of `rms` under `root` as all_dirs lists them (each job's plain name
    before its keyed ones), with a state file or not; the same objects while the entries are."""
    try:
        with os.scandir(root) as it:
            names = frozenset(e.name for e in it if e.name.startswith(f"{rms}-") and e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []
    kept = _DIRS.get((root, rms))
    if kept is not None and kept[0] == names:
        return kept[1]
    known = {d.path.name: d for d in kept[1]} if kept is not None else {}
    out = []
    for name in names:
        pdir = known.get(name)
        if pdir is None:
            try:
                pdir = PilotDir(root, rms, name[len(rms) + 1 :].partition("~")[0], name=name)
            except InputError:
                continue  # not a job's directory (vjob.pilot_files: the names it makes)
        out.append(pdir)
    out.sort(key=lambda d: (d.job_id, "~" in d.path.name, d.path.name))
    _DIRS[(root, rms)] = (names, out)
    return out


__all__ = ["pilot_dirs"]
