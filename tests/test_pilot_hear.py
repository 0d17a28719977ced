"""The agent's look at the pilot directories tick after tick (agent.pilot_hear; issue 37 item 1):
the same PilotDir objects from agent.pilot_dirs and one memo, as agent.observe.read_pilots keeps
them. What moves between two ticks is seen at the second (a new state, a new directory, a
directory swapped for a link or for somebody else's), and the users' uids that owner checks
depend on are asked again within their period, a share of them at each tick.

The tests run as root (as CI does): directories are given to this machine's accounts.
"""

from __future__ import annotations

import itertools
import os
import pwd
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent import pilot_hear
from agent.pilot_dirs import pilot_dirs
from agent.pilot_hear import OWNER_CACHE_S, HearMemo, hear
from vjob.pilot_files import PilotDir, PilotState, PilotStatus

INTERVAL = 10.0


def _pilot(root: Path, job_id: str, state: PilotState, owner: pwd.struct_passwd | None = None) -> PilotDir:
    pdir = PilotDir(root, "slurm", job_id)
    pdir.path.mkdir(parents=True, exist_ok=True)
    pdir.write_state(PilotStatus(job_id=job_id, vm=pdir.vm, node="n1", uri="qemu:///system", state=state, since=1.0))
    if owner is not None:
        os.chown(pdir.path, owner.pw_uid, owner.pw_gid)
        os.chown(pdir.state_file, owner.pw_uid, owner.pw_gid)
    return pdir


def _accounts() -> list[pwd.struct_passwd]:
    """This machine's accounts other than root, by name (a Debian base has more than six)."""
    if os.geteuid() != 0:
        pytest.fail("run as root (as CI does): the directories are given to other accounts")
    return sorted((p for p in pwd.getpwall() if p.pw_uid != 0), key=lambda p: p.pw_name)


def test_what_moves_between_two_ticks_is_seen_at_the_second(tmp_path: Path) -> None:
    memo = HearMemo()
    for job in ("1", "2", "3"):
        _pilot(tmp_path, job, PilotState.RUNNING)
    heard, refused = hear(pilot_dirs(tmp_path, "slurm"), {}, memo=memo, now=0.0)
    assert sorted(heard) == ["1", "2", "3"] and not refused
    kept = heard["2"][1]

    _pilot(tmp_path, "1", PilotState.SAVED)  # the pilot's rename
    _pilot(tmp_path, "4", PilotState.RUNNING)  # a new one
    for f in (tmp_path / "slurm-3").iterdir():  # one cleaned up
        f.unlink()
    (tmp_path / "slurm-3").rmdir()
    heard, refused = hear(pilot_dirs(tmp_path, "slurm"), {}, memo=memo, now=INTERVAL)
    assert sorted(heard) == ["1", "2", "4"] and not refused
    assert heard["1"][1].state is PilotState.SAVED and heard["4"][1].state is PilotState.RUNNING
    assert heard["2"][1] is kept  # unchanged: not read again
    assert sorted(memo.by_path) == sorted(str(tmp_path / f"slurm-{j}") for j in ("1", "2", "4"))  # 3 forgotten


def test_a_directory_swapped_between_ticks_is_refused_naming_it(tmp_path: Path) -> None:
    """The user renames their heard directory away and puts a link to another job's in its place
    (or a directory of somebody else's): the look that follows refuses it, even with the PilotDir
    and the memo of the tick before (the swap racing the listing); a fresh listing leaves the
    link out altogether, as vjob.pilot_files.all_dirs does."""
    user = _accounts()[0]
    memo = HearMemo()
    own = _pilot(tmp_path, "5", PilotState.RUNNING, user)
    _pilot(tmp_path, "6", PilotState.RUNNING)  # root's: another job's
    dirs = pilot_dirs(tmp_path, "slurm")
    users = {"5": user.pw_name, "6": "root"}
    heard, refused = hear(dirs, users, memo=memo, now=0.0)
    assert sorted(heard) == ["5", "6"] and not refused

    own.path.rename(tmp_path / "away")
    os.symlink(tmp_path / "slurm-6", own.path)
    heard, refused = hear(dirs, users, memo=memo, now=INTERVAL)
    assert "5" not in heard and refused == [("5", None, f"{own.path}: not a plain directory")]
    heard, refused = hear(pilot_dirs(tmp_path, "slurm"), users, memo=memo, now=2 * INTERVAL)
    assert sorted(heard) == ["6"] and not refused  # the link is not listed

    own.path.unlink()
    _pilot(tmp_path, "5", PilotState.RUNNING, _accounts()[1])  # another user's directory in its place
    heard, refused = hear(dirs, users, memo=memo, now=3 * INTERVAL)
    assert "5" not in heard and refused and f"owned by uid {_accounts()[1].pw_uid}" in refused[0][2]


def test_every_users_uid_is_asked_again_within_its_period_a_share_at_each_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each user's uid is asked again at most OWNER_CACHE_S (and a tick) after it was found, at
    the user's own phase: after the first tick, no tick asks for all of them; the directories
    stay heard throughout, none checked again while their user's uid is the same."""
    accounts = _accounts()[:24]
    assert len(accounts) >= 6, "fewer than six accounts on this machine"
    asked: list[tuple[float, str]] = []
    clock = SimpleNamespace(now=0.0)

    def getpwnam(name: str) -> Any:  # the real look-up, recorded
        asked.append((clock.now, name))
        return pwd.getpwnam(name)

    checks = []
    check_owner = pilot_hear._check_owner

    def counted(*args: Any) -> None:
        checks.append(clock.now)
        check_owner(*args)

    monkeypatch.setattr(pilot_hear, "pwd", SimpleNamespace(getpwnam=getpwnam))
    monkeypatch.setattr(pilot_hear, "_check_owner", counted)
    users = {}
    for i in range(120):
        account = accounts[i % len(accounts)]
        _pilot(tmp_path, str(i), PilotState.RUNNING, account)
        users[str(i)] = account.pw_name
    memo = HearMemo()
    ticks = 0
    while clock.now <= 4 * OWNER_CACHE_S:
        heard, refused = hear(pilot_dirs(tmp_path, "slurm"), users, memo=memo, now=clock.now)
        assert len(heard) == 120 and not refused, refused[:2]
        ticks += 1
        clock.now += INTERVAL
    renewals = [at for at, _ in asked if at > 0]
    assert checks.count(0.0) == 120 and sorted(checks[120:]) == renewals  # the uid came back the same: one
    # check per user asked again (the directory that asked), not one per directory
    by_user: dict[str, list[float]] = {}
    for at, name in asked:
        by_user.setdefault(name, []).append(at)
    assert sorted(by_user) == sorted(a.pw_name for a in accounts)
    for name, times in by_user.items():
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert times[0] == 0.0 and len(times) >= 4, (name, times)
        assert all(g <= OWNER_CACHE_S + INTERVAL for g in gaps), (name, times)  # within its period
        assert all(g >= OWNER_CACHE_S - INTERVAL for g in gaps[1:]), (name, times)  # then once a period
        assert 4 * OWNER_CACHE_S - times[-1] <= OWNER_CACHE_S, (name, times)
    per_tick = [sum(1 for at, _ in asked if at == t * INTERVAL) for t in range(1, ticks)]
    assert max(per_tick) < len(accounts), per_tick  # never all of them in one tick
    assert sum(1 for n in per_tick if n) >= 3, per_tick  # spread over the period's ticks


def test_a_uid_that_changes_is_seen_when_its_user_comes_due(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The directory service renumbers a user: their directories, owned by the old uid, are
    refused once the user's uid is asked again (within OWNER_CACHE_S), and not before."""
    user = _accounts()[0]
    renumbered = SimpleNamespace(on=False)

    def getpwnam(name: str) -> Any:
        found = pwd.getpwnam(name)
        return SimpleNamespace(pw_uid=found.pw_uid + 50_000) if renumbered.on and name == user.pw_name else found

    monkeypatch.setattr(pilot_hear, "pwd", SimpleNamespace(getpwnam=getpwnam))
    _pilot(tmp_path, "7", PilotState.RUNNING, user)
    memo = HearMemo()
    dirs = pilot_dirs(tmp_path, "slurm")
    assert "7" in hear(dirs, {"7": user.pw_name}, memo=memo, now=0.0)[0]
    renumbered.on = True
    due = memo.users[user.pw_name].due
    assert 0.0 < due <= OWNER_CACHE_S
    now = 0.0
    while now + INTERVAL < due:
        now += INTERVAL
        assert "7" in hear(dirs, {"7": user.pw_name}, memo=memo, now=now)[0]
    heard, refused = hear(dirs, {"7": user.pw_name}, memo=memo, now=due)
    assert "7" not in heard and refused and f"owned by uid {user.pw_uid}, not by the job's user" in refused[0][2]
