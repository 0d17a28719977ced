"""The owner rule over the pilots' directories (hear), with what the agent keeps between ticks.

Why its own module: at a site's size the agent looks at 19,000 pilot directories every tick,
and everything done per directory counts (bench/pilot_look.py). Each directory still costs two
lstat a tick, its own and its state file's: neither stands for the other (a user may rewrite the
state file in place, which leaves the directory's times alone; root may give the directory to
another owner, which leaves the state file alone; tests/test_agent_observe_caches.py). Besides
them a tick does one look-up of what the last tick found for that directory (by the PilotDir
object, which agent.pilot_dirs keeps while its entry stays) and compares; the owner check, the
state file's reading and its claim's check are done again only when what they depend on moved.

What an owner check depends on besides the directory's lstat is the job's user's uid (pwd: a
file scan or a directory service query). A uid found is asked again after at most
OWNER_CACHE_S, each user at its own phase of that period (_due, from a seeded hash of the
name), and the directories checked against it are checked again only when the answer changed.
Before, each directory's check expired OWNER_CACHE_S after it was made, so all of them (all
checked in the agent's first tick) came due in the same tick, every OWNER_CACHE_S.
"""

from __future__ import annotations

import os
import pwd
import time
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from stat import S_ISDIR, S_ISLNK, S_ISREG

from vjob.errors import InputError, VjobError
from vjob.pilot_files import PilotDir, PilotStatus, claimed_vms

OWNER_CACHE_S = 60.0
"""How long a user's uid, once found, is taken as it was: the look-up is a file scan or a
directory service query (pwd)."""
_PHASE_SEED = 37
"""crc32's starting value for a user's phase (_due): fixed, so runs and tests repeat."""
_UNCHECKED = object()
"""A state's claim not checked yet (`_Seen.claimed`: the node count it was checked against)."""


class _User:
    """A user's uid as found, and when it is asked again (time.monotonic()). Renewed in place
    while the answer is the same; a different answer is a new object, so the directories checked
    against the old one are checked again."""

    __slots__ = ("due", "uid")

    def __init__(self, uid: int, due: float) -> None:
        self.uid = uid
        self.due = due


class _Seen:
    """What the last looks found in one pilot directory.

    `fhead`, `fmtime`, `fctime`: its state file's signature when read (_signature; `fhead` None:
    nothing kept), `status` what it held, `claimed` the node count its claim was checked against
    (claimed_vms), `pair` (its PilotDir, its state) as hear returns it. `dsig`: the directory's
    own lstat at its owner check (_dir_signature; None: nothing kept), `user` the user asked
    for, `uref` the uid record the owner matched (None: root owns it, whoever the user is),
    `owners` the uids its requests may find there (PilotDir.owners). `stamp`: the last call that
    looked at it."""

    __slots__ = (
        "claimed",
        "dsig",
        "fctime",
        "fhead",
        "file",
        "fmtime",
        "owners",
        "pair",
        "path",
        "pathobj",
        "pdir",
        "stamp",
        "status",
        "uref",
        "user",
    )

    def __init__(self, pdir: PilotDir, path: str, file: str) -> None:
        self.pdir = pdir
        self.pathobj: Path = pdir.path
        self.path = path
        self.file = file
        self.fhead: tuple[int, ...] | None = None
        self.fmtime = self.fctime = -1
        self.status: PilotStatus | None = None
        self.pair: tuple[PilotDir, PilotStatus] | None = None
        self.claimed: object = _UNCHECKED
        self.dsig: tuple[int, ...] | None = None
        self.user: str | None = None
        self.uref: _User | None = None
        self.owners: tuple[int, ...] = (0,)
        self.stamp: object = None


class HearMemo:
    """What `hear` keeps between calls (the agent's: one per pilot root, agent.observe): a
    record per directory path, the same records by PilotDir object (a dict keyed by object
    identity costs a tenth of building the path's string), and the users' uids found."""

    def __init__(self) -> None:
        self.by_path: dict[str, _Seen] = {}
        self.by_dir: dict[PilotDir, _Seen] = {}
        self.users: dict[str, _User] = {}

    def record(self, pdir: PilotDir, name: str) -> _Seen:
        """The record of `pdir`'s path (`name`: the state file's), indexed by `pdir` from now on."""
        path = str(pdir.path)
        rec = self.by_path.get(path)
        if rec is None:
            rec = self.by_path[path] = _Seen(pdir, path, f"{path}/{name}")  # os.path.join costs a µs
        elif rec.pdir is not pdir or rec.pathobj is not pdir.path:
            self.by_dir.pop(rec.pdir, None)
            rec.pdir, rec.pathobj = pdir, pdir.path
            rec.pair = None if rec.status is None else (pdir, rec.status)
        self.by_dir[pdir] = rec
        return rec

    def drop_all_but(self, stamp: object, now: float) -> None:
        """Forget the directories not looked at in the call `stamp` (looked at afresh if they
        come back), and the uids due at `now`."""
        for user in [u for u, found in self.users.items() if now >= found.due]:
            del self.users[user]
        for path, rec in list(self.by_path.items()):
            if rec.stamp is not stamp:
                del self.by_path[path]
                if self.by_dir.get(rec.pdir) is rec:
                    del self.by_dir[rec.pdir]


def _due(user: str, now: float) -> float:
    """When the uid of `user` found at `now` is asked again: the next time after `now` at the
    user's own phase of OWNER_CACHE_S (so at most OWNER_CACHE_S later)."""
    phase = zlib.crc32(user.encode(), _PHASE_SEED) / 2**32 * OWNER_CACHE_S
    return now + OWNER_CACHE_S - (now + phase) % OWNER_CACHE_S


class _Uids:
    """The users' uids in one call of hear: each user asked for once in the call, a uid found
    kept in the memo until due (_due). A user not found is asked again in the next call (a
    directory service that failed once refuses a job's directory for one tick, not a period)."""

    def __init__(self, kept: dict[str, _User], now: float) -> None:
        self.kept = kept
        self.now = now
        self.asked: dict[str, _User | None] = {}

    def of(self, user: str) -> _User | None:
        if user in self.asked:
            return self.asked[user]
        found = self.kept.get(user)
        if found is None or self.now >= found.due:
            try:
                uid = pwd.getpwnam(user).pw_uid
            except KeyError:
                self.kept.pop(user, None)
                found = None
            else:
                if found is not None and found.uid == uid:
                    found.due = _due(user, self.now)  # the same answer: what was checked against it stands
                else:
                    found = self.kept[user] = _User(uid, _due(user, self.now))
        self.asked[user] = found
        return found


def _signature(info: os.stat_result) -> tuple[object, ...]:
    """What changes whenever a regular file's content may have: its mode, inode, device, link
    count, owner, group and size (the lstat's first seven fields, one slice), modification and
    change times (a user can set the first back, never the second). Why the state file's own
    and not its directory's: the pilot replaces the file by a rename, which changes the
    directory's times too, but the directory is the user's and they may write their own state
    file in place, which does not."""
    return (info[:7], info.st_mtime_ns, info.st_ctime_ns)


def _dir_signature(info: os.stat_result) -> tuple[int, ...]:
    """What the owner check of a directory depends on besides its user's uid: its mode (a link,
    a directory), inode, device, link count, owner and group — the lstat's first six fields."""
    return info[:6]  # type: ignore[return-value]


def _check_owner(pdir: PilotDir, rec: _Seen, user: str | None, info: os.stat_result, uids: _Uids) -> None:
    """PilotDir.check_owner's rule, on `info`, the directory's lstat taken in this call: a link
    or anything but a directory refused, an owner other than root or `user` refused. What it was
    found from is kept in `rec`, and the uids its requests may find there set on `pdir`."""
    rec.dsig = None
    if S_ISLNK(info.st_mode) or not S_ISDIR(info.st_mode):
        raise InputError(f"{pdir.path}: not a plain directory")
    found = uids.of(user) if user else None
    if info.st_uid != 0 and (found is None or info.st_uid != found.uid):
        raise InputError(f"{pdir.path}: owned by uid {info.st_uid}, not by the job's user {user!r}")
    rec.dsig = _dir_signature(info)
    rec.user = user
    rec.uref = found if info.st_uid else None  # root's: whoever the user is
    rec.owners = (info.st_uid, 0) if info.st_uid else (0,)


def _read_state(pdir: PilotDir, rec: _Seen, info: os.stat_result) -> None:
    """Read the directory's state (its owner checked already: pdir.owners) into `rec`, kept for
    the next calls when its file is a regular one that did not change while it was read (`info`:
    the file's lstat, taken before the owner check)."""
    rec.fhead = rec.status = rec.pair = None
    rec.claimed = _UNCHECKED
    rec.status = pdir.read_state()
    rec.pair = None if rec.status is None else (pdir, rec.status)
    if not S_ISREG(info.st_mode):
        return  # read_state refused it already; nothing is kept of anything else
    try:
        after = os.lstat(rec.file)
    except OSError:
        return
    if _signature(after) == _signature(info):
        rec.fhead, rec.fmtime, rec.fctime = _signature(info)  # type: ignore[assignment]


def _look_again(
    pdir: PilotDir,
    rec: _Seen,
    user: str | None,
    info: os.stat_result,
    dinfo: os.stat_result,
    max_vms: int | None,
    uids: _Uids,
) -> tuple[str | None, str] | None:
    """What the record of `pdir` does not cover, done again: the owner check, the state's
    reading, its claim's check, each when what it depends on moved (`info`, `dinfo`: the state
    file's and the directory's lstat taken in this call). None when the state is to be heard
    (rec.pair) or there is none; else (the VM the state named or None, why) it is refused."""
    try:
        if not (
            rec.user == user and (rec.uref is None or uids.now < rec.uref.due) and _dir_signature(dinfo) == rec.dsig
        ):
            _check_owner(pdir, rec, user, dinfo, uids)
        pdir.owners = rec.owners  # its later requests and withdrawals: the same rule
        if _signature(info) != (rec.fhead, rec.fmtime, rec.fctime):
            _read_state(pdir, rec, info)
    except VjobError as exc:
        return None, str(exc)
    st = rec.status
    if st is None or rec.claimed == max_vms:
        return None
    try:
        claimed_vms(pdir.rms, pdir.job_id, st, max_vms=max_vms)
    except InputError as exc:
        return st.vm, str(exc)
    rec.claimed = max_vms
    return None


def hear(
    dirs: Sequence[PilotDir],
    users: Mapping[str, str],
    *,
    max_vms: int | None = None,
    memo: HearMemo | None = None,
    now: float | None = None,
) -> tuple[dict[str, tuple[PilotDir, PilotStatus]], list[tuple[str, str | None, str]]]:
    """The owner rule, in one place for the agent (agent.observe.read_pilots) and `vjob status`
    (agent.status_cmd): job id → (its directory, its state) of each job heard, and (job id, VM
    the state named or None, why) of each directory refused.

    Of a job's directories (vjob.pilot_files.all_dirs: its plain name first), the first that is
    owned by `users[job]` or root, holds a state file that passes the checks, and speaks only
    of that job's VMs is heard; every other one is nobody's word. Why one function: a squatter's
    forged row must be as invisible to the operator's view as to the agent's decisions.

    `memo` (the agent's, kept between calls): a state file whose signature (_signature) has
    not changed since it was read is not read again, nor its claim checked again for the same
    `max_vms`; a directory's owner check is not repeated while the directory's lstat, its user
    and that user's uid (asked again when due, _due) are the same. What the call did not look
    at is forgotten. `now`: time.monotonic(). The loop below is what every directory costs in
    every tick: the two lstat, one look-up, the comparisons; anything else is _look_again's."""
    heard: dict[str, tuple[PilotDir, PilotStatus]] = {}
    refused: list[tuple[str, str | None, str]] = []
    memo = HearMemo() if memo is None else memo
    now = time.monotonic() if now is None else now
    stamp = object()  # this call's: what was looked at carries it, the rest is dropped at the end
    looked = 0
    uids = _Uids(memo.users, now)
    name = dirs[0].state_file.name if dirs else ""
    by_dir = memo.by_dir
    lstat = os.lstat
    for pdir in dirs:
        job_id = pdir.job_id
        if job_id in heard:
            continue  # its own directory was read already; the others are nobody's word
        rec = by_dir.get(pdir)
        if rec is None or rec.pathobj is not pdir.path:
            rec = memo.record(pdir, name)
        try:
            info = lstat(rec.file)
            dinfo = lstat(rec.path)  # after its file's: a link swapped in between is refused here
        except OSError:
            continue  # no state file (yet): not a pilot's word (vjob.pilot_files.all_dirs)
        rec.stamp = stamp
        looked += 1
        user = users.get(job_id)
        uref = rec.uref
        if (
            rec.claimed == max_vms  # read, a state, its claim checked for this node count
            and rec.user == user
            and (uref is None or now < uref.due)
            and info.st_ctime_ns == rec.fctime
            and info[:7] == rec.fhead  # _signature, in parts
            and info.st_mtime_ns == rec.fmtime
            and dinfo[:6] == rec.dsig  # _dir_signature
        ):
            pdir.owners = rec.owners  # its later requests and withdrawals: the same rule
            heard[job_id] = rec.pair  # type: ignore[assignment]  # claimed: a state was read
            continue
        why = _look_again(pdir, rec, user, info, dinfo, max_vms, uids)
        if why is not None:
            refused.append((job_id, *why))
        elif rec.pair is not None:
            heard[job_id] = rec.pair
    if len(memo.by_path) > looked:
        memo.drop_all_but(stamp, now)
    return heard, refused


__all__ = ["OWNER_CACHE_S", "HearMemo", "hear"]
