"""The pilot directories under the pilot root, listed each tick without making them again.

Why: at a site's size the root holds a directory per running vjob (19,000 in bench/agent_tick.py);
vjob.pilot_files.all_dirs makes a PilotDir (paths built by pathlib) and looks for its state file
for each one at every call, most of a tenth of a second there. Here the root is scanned (one
scandir) and the PilotDir objects of the last look are kept while its entries are the same;
whether a directory holds a state file is left to agent.observe.hear, which looks at that file
anyway. When entries come and go (every tick at a site: pilots start, directories are cleaned
up) only those are put in or taken out of the sorted list (bisect), not all of it sorted again.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

from vjob.errors import InputError
from vjob.pilot_files import PilotDir

_Key = tuple[str, bool, str]


@dataclass
class _Listing:
    """The root's entries of one RMS at the last look and the PilotDirs made of them, in
    all_dirs's order; `keys` is that order's key of each, side by side for bisect."""

    names: set[str] = field(default_factory=set)
    """Every entry that was a directory, a job's or not (a name PilotDir refuses is not tried
    again while it stays)."""
    dirs: list[PilotDir] = field(default_factory=list)
    keys: list[_Key] = field(default_factory=list)


_DIRS: dict[tuple[Path, str], _Listing] = {}


def _key(name: str, job_id: str) -> _Key:
    """all_dirs's order: by job id, the plain name before the keyed ones, then by name."""
    return (job_id, "~" in name, name)


def pilot_dirs(root: Path, rms: str) -> list[PilotDir]:
    """Every plain directory of `rms` under `root` as all_dirs lists them (each job's plain name
    before its keyed ones), with a state file or not; the same objects while the entries are,
    and the same list object while none came or went (callers must not change it)."""
    prefix = f"{rms}-"
    try:
        with os.scandir(root) as it:
            names = {e.name for e in it if e.name.startswith(prefix) and e.is_dir(follow_symlinks=False)}
    except (FileNotFoundError, NotADirectoryError):
        return []
    kept = _DIRS.setdefault((root, rms), _Listing())
    if names == kept.names:
        return kept.dirs
    dirs, keys = list(kept.dirs), list(kept.keys)  # a new list: the last one may still be in use
    for name in kept.names - names:
        job_id = name[len(prefix) :].partition("~")[0]
        i = bisect_left(keys, _key(name, job_id))
        if i < len(keys) and keys[i][2] == name:  # a name PilotDir refused is not in the list
            del keys[i], dirs[i]
    for name in names - kept.names:
        job_id = name[len(prefix) :].partition("~")[0]
        try:
            pdir = PilotDir(root, rms, job_id, name=name)
        except InputError:
            continue  # not a job's directory (vjob.pilot_files: the names it makes)
        key = _key(name, job_id)
        i = bisect_left(keys, key)
        keys.insert(i, key)
        dirs.insert(i, pdir)
    kept.names, kept.dirs, kept.keys = names, dirs, keys
    return dirs


__all__ = ["pilot_dirs"]
