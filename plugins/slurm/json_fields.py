"""The members vjob reads of each job object in Slurm's pretty-printed JSON, cut out by layout.

Why: a job object is 6.7-8.2 KB of JSON of which vjob reads some twenty members; decoding it
whole (`raw_decode`) costs four to six times cutting those members out and decoding them alone,
and at a site's size (120,000 jobs at each full read) that is seconds of CPU.

Why it is exact: Slurm prints its JSON pretty, one member a line, nested values indented deeper,
and JSON keeps line breaks out of strings (a job name's is written \\n). So inside one job
object whose members sit at indent K, a line of exactly K spaces then a quote can only start one
of that job's own members, whatever text a user wrote; its value runs to the end of that line,
or over the deeper lines that follow and the closing bracket back at indent K. The members read
are put in one small object and decoded by the json module, strictly. The layout is learnt from
each output's first job and checked against decoding that job whole (json_stream); any other
layout is decoded whole, job by job.

Unchanged jobs are not read again (`Reuse`): a job whose members read are, as text, those of the
last read gives back the same Job object — for the agent, which caches what it derives from a Job
by identity (agent.observe), that is the whole difference. A pending job's priority, expected
start and end, and planned nodes move without the job changing: they are compared only where
`parse_json.job` reads them (the priority only as held or not, the times and nodes of a running
or finished job).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from plugins.slurm import parse_json
from vjob.errors import InputError
from vjob.model import Job, JobState, Node

JOB_FIELDS = (
    "account",
    "admin_comment",
    "batch_flag",
    "comment",
    "cpus",
    "deadline",
    "end_time",
    "hold",
    "job_id",
    "job_state",
    "memory_per_cpu",
    "memory_per_node",
    "node_count",
    "nodes",
    "priority",
    "start_time",
    "state_reason",
    "submit_time",
    "time_limit",
    "tres_alloc_str",
    "tres_req_str",
    "user_id",
    "user_name",
)
"""Every member `parse_json.job` reads (tests/test_slurm_json_fields.py holds the two equal)."""
NODE_FIELDS = ("active_features", "cpus", "features", "name", "real_memory", "state", "state_flags", "weight")
"""Every member `parse_json.node` reads."""
VOLATILE = ("priority", "start_time", "end_time", "nodes")
"""Members that move while a pending job stays as it is (Reuse compares them apart)."""
_SENTINEL = b'"":0}'
"""Closes the small object: every member cut out keeps its trailing comma."""


@dataclass(frozen=True)
class Layout:
    """Slurm's pretty layout of one output: job objects at `job_indent`, their members at `key_indent`."""

    job_indent: int
    key_indent: int
    fields: tuple[str, ...] = JOB_FIELDS
    members: re.Pattern[bytes] = field(init=False, repr=False, compare=False)
    id_line: re.Pattern[bytes] = field(init=False, repr=False, compare=False)
    end: bytes = field(init=False, repr=False, compare=False)
    end_line: re.Pattern[bytes] = field(init=False, repr=False, compare=False)
    start: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        k = self.key_indent
        line = b"\n" + b" " * k  # spelt out: a literal prefix is what re searches fast
        names = "|".join(self.fields).encode()
        # a member: its line, then the deeper lines of a nested value and its closing bracket
        value = rb'": [^\n]*(?:\n {%d,}[^\n]*)*(?:%s[\]}][^\n]*)?' % (k + 1, line)
        object.__setattr__(self, "members", re.compile(line + rb'("(%s)%s)' % (names, value)))
        object.__setattr__(self, "id_line", re.compile(line + rb'"job_id": ([0-9]{1,10}),?\n'))
        object.__setattr__(self, "end", b"\n" + b" " * self.job_indent + b"}")
        object.__setattr__(self, "end_line", re.compile(re.escape(self.end)))
        object.__setattr__(self, "start", b"\n" + b" " * self.job_indent + b"{")

    def ids_line(self, ids: Collection[int]) -> re.Pattern[bytes]:
        """The id lines of these jobs only (id_line, its number one of `ids`)."""
        numbers = "|".join(str(int(i)) for i in sorted(ids)).encode() or b"(?!)"  # none: matches nothing
        return re.compile(self.id_line.pattern.replace(rb"([0-9]{1,10})", b"(" + numbers + b")"))

    def cut(self, data: bytes, start: int, end: int) -> list[tuple[bytes, bytes]]:
        """(member text, its name) of each member read, of the job object data[start:end]."""
        return self.members.findall(data, start, end)


def decode_members(found: Sequence[tuple[bytes, bytes]], where: str) -> dict[str, Any]:
    """The members cut out, decoded as one JSON object (strictly: a value that is not valid
    JSON is refused, as it is when the whole job is decoded)."""
    body = b"".join(text for text, _ in found)
    if body and not body.endswith(b","):
        body += b","  # the job's last member has no comma of its own
    text = b"{" + body + _SENTINEL
    try:
        try:
            item = json.loads(text)
        except UnicodeDecodeError:
            item = json.loads(text.decode("utf-8", "replace"))  # as the whole output is read
    except ValueError as exc:
        raise InputError(f"{where}: invalid JSON: {str(exc)[:200]}") from None
    except RecursionError:
        raise InputError(f"{where}: JSON nested too deep") from None
    item.pop("", None)
    return item


def _held(item: dict[str, Any], where: str) -> bool:
    """Whether the priority says held (0), read as parse_json.job reads it."""
    return parse_json.priority_of(item, where) == 0


_RUNNING = (JobState.RUNNING, JobState.SUSPENDED)


@dataclass
class Reuse:
    """The Jobs of the last read, by a digest of the members read that do not move by themselves.

    `job(found, where)` gives the Job of one job object's members: the same object as last time
    when nothing `parse_json.job` reads of it changed, else a new one. `begin_full()` starts a
    full read: the jobs it does not meet are forgotten when it ends (`end_full()`)."""

    entries: dict[bytes, tuple[Job, tuple[bytes, ...], bool]] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0
    _next: dict[bytes, tuple[Job, tuple[bytes, ...], bool]] | None = None

    def begin_full(self) -> None:
        self._next = {}
        self.hits = self.misses = 0

    def end_full(self) -> None:
        if self._next is not None:
            self.entries, self._next = self._next, None

    def job(self, found: Sequence[tuple[bytes, bytes]], where: str) -> Job:
        stable = [text for text, name in found if name not in _VOLATILE_B]
        moving = dict((name, text) for text, name in found if name in _VOLATILE_B)
        volatile = tuple(moving.get(name, b"") for name in _VOLATILE_B)
        key = hashlib.blake2b(b"".join(stable), digest_size=16).digest()
        kept = self.entries.get(key)
        job: Job | None = None
        if kept is not None:
            job, before, held = kept
            if volatile != before and not self._same(job, before, volatile, held, where):
                job = None
        if job is None:
            item = decode_members(found, where)
            job = parse_json.job(item, where)
            held = _held(item, where) if job.state in (JobState.PENDING, JobState.HELD) else False
            self.misses += 1
        else:
            self.hits += 1
        entry = (job, volatile, held)
        self.entries[key] = entry
        if self._next is not None:
            self._next[key] = entry
        return job

    @staticmethod
    def _same(job: Job, before: tuple[bytes, ...], now: tuple[bytes, ...], held: bool, where: str) -> bool:
        """Whether a Job read from `now`'s moving members would equal `job` (read from `before`'s):
        the priority only as held or not while pending, the start, end and nodes only where read."""
        priority, start, end, nodes = (b != a for b, a in zip(before, now, strict=True))
        if priority and job.state in (JobState.PENDING, JobState.HELD):
            text = now[0]
            if not text or _held(decode_members([(text, b"priority")], where), where) != held:
                return False
        finished = job.state.finished
        if (start or nodes) and (job.state in _RUNNING or finished):
            return False
        return not (end and finished)


_VOLATILE_B = tuple(name.encode() for name in VOLATILE)


@dataclass
class NodeReuse:
    """The Nodes of the last read by a digest of the members read (a node's load, free memory and
    times move at every look; its name, state, size and features seldom do)."""

    entries: dict[bytes, Node] = field(default_factory=dict)

    def node(self, found: Sequence[tuple[bytes, bytes]], where: str) -> Node:
        key = hashlib.blake2b(b"".join([text for text, _ in found]), digest_size=16).digest()
        node = self.entries.get(key)
        if node is None:
            node = self.entries[key] = parse_json.node(decode_members(found, where), where)
        return node

    def keep_only(self, nodes: Sequence[Node]) -> None:
        """Forget the nodes of earlier reads that this one did not meet."""
        if len(self.entries) > 2 * len(nodes):
            live = {id(n) for n in nodes}
            self.entries = {k: n for k, n in self.entries.items() if id(n) in live}


def first_job_check(layout: Layout, data: bytes, start: int, end: int, whole: Any) -> bool:
    """Whether the layout reads the first object as decoding it whole does: the same members
    with the same values, and (a job) its id line the job's own id."""
    if not isinstance(whole, dict):
        return False
    try:
        cut = decode_members(layout.cut(data, start, end), "first job")
    except InputError:
        return False
    if cut != {k: whole[k] for k in layout.fields if k in whole}:
        return False
    if layout.fields != JOB_FIELDS:
        return True
    ids = layout.id_line.findall(data, start, end)
    return len(ids) == 1 and whole.get("job_id") == int(ids[0])


__all__ = ["JOB_FIELDS", "NODE_FIELDS", "VOLATILE", "Layout", "NodeReuse", "Reuse", "decode_members", "first_job_check"]
