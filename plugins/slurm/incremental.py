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

What the listing cannot see: a change to a job's comment, admin comment, account or deadline
alone (user text, left out on purpose) is seen at the next resync. The priority's value is not
compared (it moves at every tick with age and vjob's own site factor): only held or not.
"""

from __future__ import annotations

import bisect
import operator
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from itertools import compress, repeat

from plugins.slurm import transitions
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
    once (`_priority_only`: a read of 120,000 lines of which 100,000 moved so cost 0.25-0.38 s
    of CPU line by line, 0.19-0.23 s so, the heap frozen as the agent's is). Every other new
    line must match the strict pattern. After an Inconsistent listing nothing is kept."""

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

    Why in bulk: the lines are cut and compared by C loops over all of them (map, compress,
    set operations), not one Python iteration each, and no per-line tuple is made (100,000
    alive at once cost more in the cyclic collector's passes than the cut). A line's key is
    the line without its trailing ASCII digits; a new line pairs with the gone line of the
    same key when that key ends with `|` (so both lines are their job's head, all before the
    last `|`, job id first, and a priority of ASCII digits only). The other checks are those
    of a line read alone: 1 to 20 digits, "0" exactly when the gone one was (held), one new
    line per job; a pair that fails one is read line by line, as any new line."""
    if not added or not gone:
        return added, {_job_id(line) for line in gone}
    lines = list(added)
    keys = list(map(str.rstrip, lines, repeat(_DIGITS)))
    heads = set(keys)
    if len(heads) != len(keys):  # a job twice: read line by line (Inconsistent)
        return added, {_job_id(line) for line in gone}
    old_lines = list(gone)
    old_keys = set(map(str.rstrip, old_lines, repeat(_DIGITS)))
    kept = heads & old_keys
    if ("\n".join(kept) + "\n").count("|\n") != len(kept):  # a key not ending with "|"
        kept = {key for key in kept if key.endswith("|")}
    kept -= _held(lines) ^ _held(old_lines)  # held or released: read
    widths = list(map(operator.sub, map(len, lines), map(len, keys)))  # each priority's digits
    if min(widths) < 1 or max(widths) > _PRIORITY_DIGITS:
        kept -= set(compress(keys, map(_not_width, widths)))
    if not kept:
        return added, {_job_id(line) for line in gone}
    read = heads - kept
    to_read = list(compress(lines, map(read.__contains__, keys))) if read else []
    return to_read, set(map(_job_id, old_keys - kept))


def _held(lines: list[str]) -> set[str]:
    """The keys of the lines whose priority is exactly 0 (held), looked for in one block first:
    seldom any."""
    if "|0\n" not in "\n".join(lines) + "\n":
        return set()
    return set(map(str.rstrip, compress(lines, map(str.endswith, lines, repeat("|0"))), repeat(_DIGITS)))


def _not_width(width: int) -> bool:
    """Whether a priority of `width` digits is not one a paired line may take unread."""
    return not 1 <= width <= _PRIORITY_DIGITS


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
    jobs_by_id: dict[str, Job] = field(default_factory=dict)
    keys: dict[str, Row] = field(default_factory=dict)
    """Job id → its Row when its JSON was read or its state change applied (a job whose Row
    differs is looked at again: applied from the Row, or read again)."""
    listed: Listing = field(default_factory=Listing)
    applied: set[str] = field(default_factory=set)
    """The jobs whose Job was last put together from the listing (checked at the next full read)."""
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
        look.new = sum(1 for j in wanted if j not in self.jobs_by_id)
        look.changed = len(wanted) - look.new
        self._apply(wanted, rows, look)  # first: a state change costs no JSON, whatever their number
        if len(wanted) > max(100, BIG_CHANGE * len(rows)):
            return self._full(look, f"{len(wanted)} of {len(rows)} jobs new or changed beyond their state", rows)
        gone = self.jobs_by_id.keys() - rows.keys()
        look.gone = len(gone)
        removed, added = set(gone), set()
        for job_id in gone:
            del self.jobs_by_id[job_id]
            self.keys.pop(job_id, None)
            self.applied.discard(job_id)
        if wanted:
            found = self._checked(self.fetch(wanted), wanted, look)
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
        look.full, look.reason = True, reason
        found: dict[str, Job] = {}
        for job in self.read_all():
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


def _id_order(job_id: str) -> tuple[int, str]:
    head = job_id.split("_")[0].split("+")[0]
    return (int(head) if head.isdigit() else 0, job_id)


__all__ = ["LISTING_ARGS", "LISTING_FORMAT", "Inconsistent", "IncrementalJobs", "Listing", "Look", "Row", "listing"]
