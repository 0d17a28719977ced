"""The pilot root listed each tick with only what came or went put in or taken out
(agent.pilot_dirs, issue 37 item 1): at every step of a seeded random history of directories
made and removed — plain and keyed names, names that are no job's, symlinks and plain files in
their place — the listing is all_dirs's, in its order, and the same PilotDir objects while their
entries stay.
"""

from __future__ import annotations

import os
import random
import secrets
from pathlib import Path

from agent.pilot_dirs import pilot_dirs
from vjob.pilot_files import all_dirs


def _make(rnd: random.Random, root: Path) -> None:
    """A new entry: mostly a job's directory with a state file (all_dirs lists only those)."""
    job = str(rnd.randrange(1, 60))
    kind = rnd.random()
    if kind < 0.6:
        name = f"slurm-{job}"
    elif kind < 0.8:
        name = f"slurm-{job}~{secrets.token_hex(8)}"
    elif kind < 0.85:
        name = f"slurm-{job}~notakey"  # no job's name: never listed
    elif kind < 0.9:
        name = f"oar-{job}"  # another RMS's
    else:
        target = root / f"slurm-{job}-link"
        if not os.path.lexists(target):
            os.symlink(root, target)  # a link is never listed
        return
    path = root / name
    if rnd.random() < 0.1:
        if not os.path.lexists(path):
            path.write_text("")  # a file in a directory's place: never listed
        return
    if not os.path.lexists(path):
        path.mkdir()
        (path / "state.json").write_text("{}")


def _remove(rnd: random.Random, root: Path) -> None:
    entries = sorted(os.listdir(root))
    if not entries:
        return
    path = root / rnd.choice(entries)
    if path.is_dir() and not path.is_symlink():
        for f in path.iterdir():
            f.unlink()
        path.rmdir()
    else:
        path.unlink()


def test_the_listing_follows_entries_made_and_removed_in_all_dirs_order(tmp_path: Path) -> None:
    rnd = random.Random(37)
    root = tmp_path / "pilots"
    root.mkdir()
    assert pilot_dirs(root, "slurm") == []
    last: dict[str, object] = {}
    for step in range(200):
        for _ in range(rnd.randrange(5)):
            _make(rnd, root)
        for _ in range(rnd.randrange(3)):
            _remove(rnd, root)
        got = pilot_dirs(root, "slurm")
        want = all_dirs(root, "slurm")
        assert [(d.job_id, d.path) for d in got] == [(d.job_id, d.path) for d in want], step
        for d in got:
            assert last.get(d.path.name, d) is d, step  # the same object while its entry stays
        last = {d.path.name: d for d in got}
        assert pilot_dirs(root, "slurm") is got  # nothing came or went: the same list
    assert len(last) > 20


def test_no_root_lists_nothing(tmp_path: Path) -> None:
    assert pilot_dirs(tmp_path / "none", "slurm") == []
