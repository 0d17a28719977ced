"""Observing Slurm's jobs incrementally: a cheap numeric listing each tick, JSON only for what changed.

Why: at a site's size the JSON of every job is 0.5-1 GB (3.7-9 KB a job); reading it every
tick costs seconds of CPU and GiBs of memory for jobs that did not change. Each tick instead:

1. `SLURM_TIME_FORMAT=%s squeue -h -t all -o "%A|%T|%D|%C|%m|%l|%V|%S|%N|%Q"` lists every
   job in one line of numbers and Slurm's own words: id, state, node and CPU counts, memory,
   time limit, submit and start times (POSIX seconds), allocated nodes, priority (Slurm
   22.05's squeue has no "last changed" time of a job; `LastSchedEval` moves at every
   scheduling pass). No field of it is text a user writes (no name, comment, path or
   account), and every line must match a strict pattern: the job-name forgery of the text
   path (parse_text) has nothing to hide in.
2. A job is new, changed (its line differs in what vjob reads) or gone. A changed job whose
   Row differs from the Row of its last JSON read only in what a state change moves (state
   word, start time, allocated nodes, held or not) gets its Job from the kept one with those
   put in (plugins.slurm.transitions: exactly as parse_json builds them from the JSON; any
   other difference, or a case that is not certain, is read as JSON). The new jobs and the
   other changed ones are read as JSON (`squeue --json --jobs=...` where Slurm honours the
   filter, 23.02 and later; on 20.11-22.05 squeue --json ignores it, so the whole listing is
   read as a stream and only those jobs are decoded into Jobs). The JSON stays the only source
   of what a user writes (name, comment, account) and of every field a state change does not
   move.
3. A full JSON read replaces the cache every `resync_every` ticks, and at once when the listing
   is inconsistent (a line that does not match, an id twice, a state vjob does not know) or
   when more than a quarter of the jobs are to be read (new, or changed beyond their state:
   then one full read is the cheaper way). There every job applied from its Row since the
   last full read whose Row has not moved since is compared with its JSON
   (transitions.CHECKED): a difference is counted (`Look.drift`) and logged, and the JSON
   replaces it, so any drift heals.
4. **Paced** (plugins.slurm.json_pace): each JSON read is timed, and the next fetch is due only
   once squeue --json has been idle for (1/share − 1) times the next fetch's expected wall time
   (json_pace: the last fetch's). Until
   then a new job is held back (not returned; `Look.deferred`) and a job changed beyond its
   state keeps its last Job and its old Row key (`Look.stale`: looked at again at the next
   read; a running vjob never vanishes from the view), while state changes the listing can
   apply are applied and gone jobs removed as at every tick. A state change the listing cannot
   apply by itself (a requeue moves the submit time) makes the read due at once, a wake (an
   interactive job came) paces it to the looser woken share; the resync and the first read
   are never held back.

What the listing cannot see: a change to a job's comment, admin comment, account or deadline
alone (user text, left out on purpose) is seen at the next resync. The priority's value is not
compared (it moves at every tick with age and vjob's own site factor): only held or not.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from itertools import compress

import numpy as np

from plugins.slurm import transitions
from plugins.slurm.json_pace import Pace
from plugins.slurm.states import job_state
from vjob import log
from vjob.errors import InputError
from vjob.model import Job, JobState

LISTING_FORMAT = "%A|%T|%D|%C|%m|%l|%V|%S|%N|%Q"
LISTING_ARGS = ("-h", "-t", "all", "-o", LISTING_FORMAT)
"""squeue's arguments for the listing (every state: a suspended job is not in the default).
The priority comes last: it moves at every tick for most pending jobs, and the rest of a line
is compared as it is printed."""
LISTING_ENV = (("SLURM_TIME_FORMAT", "%s"),)
"""The listing's environment: submit and start times as POSIX seconds (squeue prints them with
strftime; 22.05 honours it for -o %V/%S, checked on the dev cluster under another TZ), so a
start time put into a Job from the listing is exact, never a local time read in a guessed zone."""
_LINE = re.compile(
    r" *([0-9]{1,10}) *\|"  # %A job id (unique per array task)
    r" *([A-Z_]{1,32}) *\|"  # %T state word
    r" *([0-9]{1,10}) *\|"  # %D nodes
    r" *([0-9]{1,10}) *\|"  # %C CPUs
    r" *([0-9]{1,20}(?:\.[0-9]{1,6})?[A-Za-z]{0,2}) *\|"  # %m memory (2G, 500M, 0)
    r" *([A-Za-z0-9:/_-]{1,32}) *\|"  # %l time limit (1-00:00:00, UNLIMITED)
    r" *([A-Za-z0-9:/_-]{1,32}) *\|"  # %V submit time (ISO)
    r" *([A-Za-z0-9:/_-]{1,32}) *\|"  # %S start time (ISO, N/A)
    r" *([A-Za-z0-9\[\],._-]{0,65536}) *\|"  # %N allocated nodes (the admin's node names)
    r" *([0-9]{1,20}) *"  # %Q priority
)
BIG_CHANGE = 0.25
"""Past this share of the listed jobs to read as JSON (new, or changed beyond their state), a
full read is the cheaper way."""


class Inconsistent(InputError):
    """The listing cannot be trusted as a whole: resync."""


Row = tuple[str, ...]
"""What vjob compares of one listed job: state word, node and CPU counts, memory, time limit,
submit time, start time and nodes (of a running job), and "held" or ""."""


class Listing:
    """The listing read tick after tick: a line printed as it was last time is not read again.

    Why: at a site's size the listing has 120,000 lines, most of them the same from one tick to
    the next; the lines are compared as a whole first (one set difference, in C), and only the
    new ones are split. A new line that differs from its job's last one only in the priority
    (it moves with age) is not checked again either (its job's line matched before): at a
    recalculation that is every pending job's line, so those are found for all new lines at
    once (`_priority_only`: 100,000 of 120,000 lines moved cost 0.25-0.38 s of CPU line by line,
    0.2 s in sets, 0.12 s cut in arrays). Every other new line must match the strict pattern.
    After an Inconsistent listing nothing is kept."""

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        """Job id → its Row, for every unfinished job listed."""
        self.changed: set[str] = set()
        """The ids of the last read whose Row is new or differs from the read before."""
        self._lines: set[str] = set()
        """The lines of the last read (each job's id is its line's first field)."""
        self._listed: set[str] = set()
        """The ids of the jobs of the last read, finished ones too."""

    def read(self, text: str, *, source: str = "squeue listing") -> dict[str, Row]:
        """The rows of the listing `text` (also kept in `rows`); Inconsistent when a line does not
        match the pattern, an id comes twice or a state is unknown (then nothing is kept)."""
        try:
            return self._read(text, source)
        except Inconsistent:
            self.__init__()  # type: ignore[misc]
            raise

    def _read(self, text: str, source: str) -> dict[str, Row]:
        lines = text.split("\n")
        now = set(lines)
        now.discard("")
        if len(now) != len(lines) - lines.count(""):
            raise Inconsistent(f"{source}: a line is listed twice")
        gone = self._lines.difference(now)
        added, gone_ids = _priority_only(now.difference(self._lines), gone)
        self.changed = changed = set()
        fresh: dict[str, str] = {}  # job id → its new line
        listed = self._listed
        for line in added:
            job_id = line[: line.find("|")].strip()
            if not job_id and not line.strip():
                continue
            if job_id in fresh or (job_id in listed and job_id not in gone_ids):
                raise Inconsistent(f"{source}: job {job_id[:20]!r} listed twice")
            fresh[job_id] = line
        rows = self.rows
        for job_id in gone_ids - fresh.keys():
            rows.pop(job_id, None)
            listed.discard(job_id)
        for job_id, line in fresh.items():
            head, _, priority = line.rpartition("|")
            row = self._row(job_id, line, head, priority, source)
            if row is None:
                if rows.pop(job_id, None) is not None:
                    changed.add(job_id)
                continue
            if rows.get(job_id) != row:
                changed.add(job_id)
            rows[job_id] = row
        self._lines = now
        return rows

    def _row(self, job_id: str, line: str, head: str, priority: str, source: str) -> Row | None:
        """The Row of one new line, read by the pattern (None: a finished job)."""
        held = "held" if priority.strip() == "0" else ""
        found = _LINE.fullmatch(line)
        if found is None:
            raise Inconsistent(f"{source}: a line is not a listing line: {line[:80]!r}")
        state_word = found.group(2)
        state = _STATES.get(state_word)
        if state is None:
            try:
                state = _STATES[state_word] = job_state(state_word, where=source)
            except InputError as exc:
                raise Inconsistent(str(exc)) from None
        row: Row | None = None
        if not state.finished:
            running = state in (JobState.RUNNING, JobState.SUSPENDED)
            nodes, cpus, memory, limit, submit, start, alloc = found.group(3, 4, 5, 6, 7, 8, 9)
            started = (start, alloc) if running else ("", "")
            row = (state_word, nodes, cpus, memory, limit, submit, *started, held)
        self._listed.add(job_id)
        return row


def _priority_only(added: set[str], gone: set[str]) -> tuple[Collection[str], set[str]]:
    """Of the new lines (`added`), those to read, and the ids of the jobs whose line is gone
    (`gone`, last read's lines no longer printed): a new line that differs from its job's gone
    line only in the priority is neither (its job's Row stays), what a recalculation moves in
    100,000 lines at once.

    Why in bulk: the lines are cut in arrays (`_cut`) and compared as sets, no per-line Python
    step or tuple. A new line pairs with the gone line of the same key (the line without its
    trailing ASCII digits) ending with `|` (their job's head), of 1 to 20 digits, "0" exactly
    when the gone one was (held), one new line per job; any other is read line by line."""
    if not added or not gone:
        return added, {_job_id(line) for line in gone}
    lines, old_lines = list(added), list(gone)
    new, old = _cut(lines), _cut(old_lines)
    # not ASCII, or a job twice: no listing, read line by line (Inconsistent)
    if new is None or old is None or len(heads := set(new[0])) != len(new[0]):
        return added, {_job_id(line) for line in gone}
    (keys, fits, held), (old_keys_list, old_fits, old_held) = new, old
    old_keys = set(old_keys_list)
    kept = heads & old_keys
    kept.difference_update(_picked(keys, ~fits) + _picked(old_keys_list, ~old_fits))  # not a head, or a width
    kept -= set(_picked(keys, held)) ^ set(_picked(old_keys_list, old_held))  # held or released
    if not kept:
        return added, {_job_id(line) for line in gone}
    read = heads - kept
    to_read = list(compress(lines, map(read.__contains__, keys))) if read else []
    return to_read, set(map(_job_id, old_keys - kept))


def _cut(lines: list[str]) -> tuple[list[str], np.ndarray, np.ndarray] | None:
    """Each line's key (`line.rstrip(_DIGITS)`), whether it fits (the key ends with `|`, 1 to 20
    digits cut) and is held ("0" cut), in arrays of the lines' bytes; None when not ASCII."""
    try:
        raw = "\n".join(lines).encode("ascii")
    except UnicodeEncodeError:
        return None
    text = np.frombuffer(raw, dtype=np.uint8)
    ends = np.append(np.flatnonzero(text == ord("\n")), text.size)
    starts = np.concatenate(([0], ends[:-1] + 1))
    widths, going = np.zeros(ends.size, dtype=np.int64), ends > starts  # each line's trailing digits
    for back in range(1, _PRIORITY_DIGITS + 2):
        going &= ends - back >= starts
        going &= np.subtract(text[np.where(going, ends - back, 0)], ord("0"), dtype=np.uint8) < 10
        if not going.any():
            break
        widths += going
    for k in np.flatnonzero(widths > _PRIORITY_DIGITS).tolist():  # more than a priority: as rstrip
        widths[k] = len(lines[k]) - len(lines[k].rstrip(_DIGITS))
    last = ends - widths - 1  # each line's last byte not a digit (before its start: none)
    drop = np.zeros(text.size + 1, dtype=np.int8)  # +1 where a line's digits start, -1 past them
    drop[last[widths > 0] + 1] = 1
    drop[ends[widths > 0]] = -1
    np.cumsum(drop, out=drop)
    drop ^= 1  # 1 where a byte is kept
    keys = text[drop[:-1].view(np.bool_)].tobytes().decode("ascii").split("\n")
    fits = (last >= starts) & (text[np.maximum(last, 0)] == ord("|")) & (widths >= 1) & (widths <= _PRIORITY_DIGITS)
    held = fits & (widths == 1) & (text[np.minimum(last + 1, text.size - 1)] == ord("0"))
    return keys, fits, held


def _picked(keys: list[str], where: np.ndarray) -> list[str]:  # seldom any
    return list(map(keys.__getitem__, np.flatnonzero(where).tolist()))


def _job_id(line: str) -> str:
    """The job id of a line read before, or of its head (its first field, stripped)."""
    return line[: line.find("|")].strip()


_PRIORITY_DIGITS = 20
"""A priority's most digits (%Q in the pattern)."""
_DIGITS = "0123456789"
"""The ASCII digits (str.isdigit also takes other scripts' digits)."""
_STATES: dict[str, JobState] = {}
"""Slurm's state words met so far → vjob's state (job_state, once a word)."""


def listing(text: str, *, source: str = "squeue listing") -> dict[str, Row]:
    """Job id → its Row, for every job of `text` that is not finished (Listing.read, once)."""
    return Listing().read(text, source=source)


@dataclass
class Look:
    """What one observation did (for the bench and the logs)."""

    full: bool = False
    reason: str = ""
    listed: int = 0
    new: int = 0
    changed: int = 0
    gone: int = 0
    fetched: int = 0
    applied: int = 0
    """Changed jobs whose state change was put in from the listing (no JSON read for them)."""
    drift: int = 0
    """At a full read: jobs applied from the listing that differ from their JSON (0 expected)."""
    deferred: int = 0
    """New jobs held back: their JSON read not due yet (json_pace)."""
    stale: int = 0
    """Jobs changed beyond their state kept as last read: their JSON read not due yet."""
    urgent: int = 0
    """Jobs whose state change the listing could not apply: the read made due at once."""
    read: bool = False
    """Whether this observation ran a JSON read (a fetch or a full read)."""
    rejected: list[str] = field(default_factory=list)


@dataclass
class IncrementalJobs:
    """The jobs Slurm lists, kept between ticks and refreshed from what changed.

    `list_jobs()` runs the listing; `fetch(ids)` reads those jobs' JSON (any job it returns
    that was not asked for is rejected); `read_all()` reads every job's JSON."""

    list_jobs: Callable[[], str]
    fetch: Callable[[set[str]], Iterable[Job]]
    read_all: Callable[[], Iterable[Job]]
    resync_every: int = 30
    pace: Pace = field(default_factory=Pace)
    """When the next fetch is due (plugins.slurm.json_pace; the default: at every tick)."""
    jobs_by_id: dict[str, Job] = field(default_factory=dict)
    keys: dict[str, Row] = field(default_factory=dict)
    """Job id → its Row when its JSON was read or its state change applied (a job whose Row
    differs is looked at again: applied from the Row, or read again)."""
    listed: Listing = field(default_factory=Listing)
    applied: set[str] = field(default_factory=set)
    """The jobs whose Job was last put together from the listing (checked at the next full read)."""
    held: set[str] = field(default_factory=set)
    """The jobs whose read was held back by the pace (looked at again until read)."""
    since_full: int = 0
    synced: bool = False
    last: Look = field(default_factory=Look)
    _order: list[str] = field(default_factory=list)

    def jobs(self) -> list[Job]:
        """The unfinished jobs, in job id order; a full read when due or when the listing
        cannot be trusted."""
        look = Look()
        try:
            rows = self.listed.read(self.list_jobs())
        except Inconsistent as exc:
            log.get("slurm").warning("job listing inconsistent: full read", error=str(exc))
            return self._full(look, "inconsistent listing", None)
        look.listed = len(rows)
        if not self.synced:
            return self._full(look, "first read", rows)
        if self.since_full + 1 >= self.resync_every:
            return self._full(look, f"every {self.resync_every} ticks", rows)
        # only a job whose line changed, or that has no Row of its read, can differ
        wanted = {j for j in self.listed.changed if j in rows and _changed(self.keys.get(j), rows[j])}
        wanted |= rows.keys() - self.keys.keys()
        wanted |= {j for j in self.held if j in rows and _changed(self.keys.get(j), rows[j])}
        look.new = sum(1 for j in wanted if j not in self.jobs_by_id)
        look.changed = len(wanted) - look.new
        self._apply(wanted, rows, look)  # first: a state change costs no JSON, whatever their number
        look.urgent = sum(1 for j in wanted if j in self.jobs_by_id and _state_moved(self.keys.get(j), rows[j]))
        if wanted and not look.urgent and not self.pace.due():
            look.deferred = sum(1 for j in wanted if j not in self.jobs_by_id)
            look.stale = len(wanted) - look.deferred
            self.held, wanted = wanted, set()  # the new ones not returned, the changed ones kept as read
            log.get("slurm").debug("jobs' JSON read held back by its pace", deferred=look.deferred, stale=look.stale)
        elif len(wanted) > max(100, BIG_CHANGE * len(rows)):
            return self._full(look, f"{len(wanted)} of {len(rows)} jobs new or changed beyond their state", rows)
        gone = self.jobs_by_id.keys() - rows.keys()
        look.gone = len(gone)
        removed, added = set(gone), set()
        for job_id in gone:
            del self.jobs_by_id[job_id]
            self.keys.pop(job_id, None)
            self.applied.discard(job_id)
        if wanted:
            self.held = set()
            found = self._checked(self.pace.timed(lambda: list(self.fetch(wanted))), wanted, look)
            look.read = True
            for job_id in wanted:
                job = found.get(job_id)
                self.applied.discard(job_id)
                if job is None or job.state.finished:  # ended between the listing and the read
                    if self.jobs_by_id.pop(job_id, None) is not None:
                        removed.add(job_id)
                    self.keys.pop(job_id, None)
                else:
                    if job_id not in self.jobs_by_id:
                        added.add(job_id)
                    self.jobs_by_id[job_id] = job
                    self.keys[job_id] = rows[job_id]
            look.fetched = len(found)
        self.since_full += 1
        self.last = look
        return self._ordered(added, removed)

    def wake(self) -> None:
        """Something that must not wait may have come (an interactive job): the next fetch is
        paced to the woken share (json_pace.Pace.wake)."""
        self.pace.wake()

    def _apply(self, wanted: set[str], rows: dict[str, Row], look: Look) -> None:
        """Put the state change of each changed job that only changed state into its kept Job
        (transitions.applied); those leave `wanted`, the rest are read as JSON."""
        for job_id in [j for j in wanted if j in self.keys]:
            kept = self.jobs_by_id.get(job_id)
            if kept is None:
                continue
            job = transitions.applied(kept, self.keys[job_id], rows[job_id])
            if job is None:
                continue
            self.jobs_by_id[job_id] = job
            self.keys[job_id] = rows[job_id]
            self.applied.add(job_id)
            wanted.discard(job_id)
            look.applied += 1

    def _check_applied(self, found: dict[str, Job], rows: dict[str, Row] | None, look: Look) -> None:
        """At a full read: each job applied from its Row whose Row did not move since must read
        back equal (transitions.CHECKED) to its JSON; a difference is counted and logged."""
        drifted: list[str] = []
        applied, self.applied = self.applied, set()
        listed = rows if rows is not None else {}  # an inconsistent listing: nothing to compare
        for job_id in applied:
            kept, read = self.jobs_by_id.get(job_id), found.get(job_id)
            if kept is None or read is None or read.state.finished or listed.get(job_id, ()) != self.keys.get(job_id):
                continue  # gone, or changed again since: nothing to compare
            fields = transitions.drift(kept, read)
            if fields:
                drifted.append(f"job {job_id}: {', '.join(fields)}")
        look.drift = len(drifted)
        if drifted:
            log.get("slurm").warning(
                "jobs applied from the listing differ from their JSON (replaced by it)",
                jobs=drifted[:20],
                count=len(drifted),
            )

    def _full(self, look: Look, reason: str, rows: dict[str, Row] | None) -> list[Job]:
        """Every job's JSON: the cache replaced. Keys come from the listing read just before
        (a job that changed in between differs at the next tick and is looked at again: what a
        state change moves then comes from its new Row, the rest was read after it); a job the
        JSON has and the listing had not gets no key, so it is read again next tick too."""
        look.full, look.reason, look.read = True, reason, True
        self.held = set()
        found: dict[str, Job] = {}
        for job in self.pace.timed(lambda: list(self.read_all()), full=True):
            if job.id in found:
                look.rejected.append(f"job {job.id}: twice in one listing")
                continue
            found[job.id] = job
        self._check_applied(found, rows, look)
        self.jobs_by_id = {j: job for j, job in found.items() if not job.state.finished}
        self.keys = {j: rows[j] for j in self.jobs_by_id if j in rows} if rows is not None else {}
        look.fetched = len(found)
        self.since_full = 0
        self.synced = rows is not None  # after an inconsistent listing, the next tick reads all again
        self.last = look
        if look.rejected:
            log.get("slurm").warning("job records left out", records=look.rejected[:20], count=len(look.rejected))
        return self._ordered(whole=True)

    def _checked(self, jobs: Iterable[Job], wanted: set[str], look: Look) -> dict[str, Job]:
        """The fetched jobs that were asked for, once each; any other record is left out and
        named (the JSON of a job that was not listed is not believed)."""
        found: dict[str, Job] = {}
        for job in jobs:
            if job.id not in wanted or job.id in found:
                look.rejected.append(f"job {job.id}: not (or not once) among the listed jobs asked for")
                continue
            found[job.id] = job
        if look.rejected:
            log.get("slurm").warning("job records left out", records=look.rejected[:20], count=len(look.rejected))
        return found

    def _ordered(self, added: Collection[str] = (), removed: Collection[str] = (), *, whole: bool = False) -> list[Job]:
        """The jobs in id order: the order of the last call kept, with only the jobs this call
        `added` and `removed` put in or taken out by bisection (`whole`: sorted again, after a
        full read). Why: at a site's size a set difference or a sort over 120,000 ids costs
        more than the tick's few changes; should the order and the jobs ever disagree, it is
        sorted again rather than trusted."""
        order = self._order
        if whole or len(added) > 1000 or len(removed) > 1000:
            order = self._order = sorted(self.jobs_by_id, key=_id_order)
        else:
            for job_id in removed:
                at = bisect.bisect_left(order, _id_order(job_id), key=_id_order)
                if at < len(order) and order[at] == job_id:
                    del order[at]
            for job_id in added:
                bisect.insort(order, job_id, key=_id_order)
        jobs = self.jobs_by_id
        if len(order) == len(jobs):
            try:
                return [jobs[j] for j in order]
            except KeyError:
                pass
        self._order = sorted(jobs, key=_id_order)
        return [jobs[j] for j in self._order]


def _changed(before: Row | None, now: Row) -> bool:
    """Whether a job differs in what vjob reads (a pending job's expected start moves with
    every backfill pass: the Row leaves it out)."""
    return before is None or before != now


def _state_moved(before: Row | None, now: Row) -> bool:
    """Whether a kept job's state word or held mark moved in a way the listing could not put in
    (a requeue, which also moves the submit time on 22.05): never held back, the view would
    show the job in a state it has left."""
    return before is not None and (before[0] != now[0] or before[-1] != now[-1])


def _id_order(job_id: str) -> tuple[int, str]:
    head = job_id.split("_")[0].split("+")[0]
    return (int(head) if head.isdigit() else 0, job_id)


__all__ = ["LISTING_ARGS", "LISTING_FORMAT", "Inconsistent", "IncrementalJobs", "Listing", "Look", "Row", "listing"]
