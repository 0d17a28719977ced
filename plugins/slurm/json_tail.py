"""A few jobs' JSON out of a whole `squeue --json` (20.11-22.05) read from its end, not streamed.

Why: on 20.11-22.05 `squeue --json` ignores every filter (shared notes on Slurm) and prints
every job, 805 MB at a site's size, even when the agent wants the ~20 jobs that are new since its
last tick. Streaming all of it through a pipe costs the agent the pipe's copy, a 4 MB concat per
chunk and a regex over every byte (~0.5 s of CPU a tick). Here squeue's standard output is a
memfd (os.memfd_create): squeue writes the whole output into it with its own CPU, and the agent
then reads what it needs with pread, in windows: the head (the top-level object up to the jobs
array and the first job, whose layout is learnt and checked as json_stream does), the jobs
array's end in the last window, and windows backwards from there, each searched for the wanted
jobs' own id lines (json_fields.Layout.ids_line) and each found job cut out as json_stream's
_asked cuts it, until every wanted job is found; the rest of the top-level object after the array
is walked and checked as json_stream walks it. A job not found near the end is searched on
towards the start, so the answer does not depend on the order; the order only makes it cheap.

The order, seen on the 22.05 dev cluster: squeue prints the jobs in slurmctld's job list order;
a new job is appended; a job that starts, is held, released, requeued, updated or cancelled keeps
its place, also over a slurmctld restart. One exception: when an array task starts, the record
it splits from keeps its place under the task's new id and the array's pending rest moves to the
end, so a started array task is found where its array last was.

What is checked: what json_stream checks of a read for some ids (the top-level object, "meta"'s
layout, the layout learnt from the first job and checked against decoding it whole, each found
job ending as the layout says, the array's end and what follows it up to the end of the output).
Two differences, both about output Slurm does not print. The array's end is taken as the last job
end followed by a closing bracket in the output's last TAIL bytes, and the object before it must
hold one job id line; anything else there (no such end, an array of other objects after the jobs)
sends the read forward from the first job, as json_stream reads it. Only a later top-level array
whose last object holds a job id line at the jobs' indents could pass for the jobs array. And once
every wanted id is found the search stops, so a second record of an id further back (slurmctld
keeps ids unique) is not returned.

The cost: the output sits in shared memory, charged to the agent's cgroup, from squeue's first
write until the fetch returns (squeue 22.05 builds its whole output as one string before printing
it, src/squeue/data.c, so it held more than that itself a moment before; the memfd adds at most
the output's size to that moment's peak, and nothing after the fetch). It is not mapped: the
agent's resident memory grows by the windows it reads only. Freeing those pages when the memfd is
closed is the agent's kernel time: 0.14 ms a MB here, 0.11 s of the 0.12 s the fetch costs the
agent at 805 MB (the stream cost 0.57 s; bench/json_fetch.py); writing into fresh shared pages
costs squeue more than writing into a pipe (+0.19 s there). Keeping one memfd from tick to tick,
written over in place, would spare both but hold the output's size in memory for good: not done.
Past MEMFD_MAX bytes (the size of the last output seen) the pipe stream is used instead, so a
site whose listing outgrows it pays CPU, not memory.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Collection, Iterator, Sequence

from plugins.slurm import json_stream
from plugins.slurm.commands import SlurmCommands
from plugins.slurm.json_fields import Layout, Reuse
from plugins.slurm.json_stream import CHUNK, FEW_IDS, _Buffer
from vjob.errors import CommandUnavailable, InputError
from vjob.model import Job

MEMFD_MAX = 2 << 30
"""Bytes: an output larger than this (the last one seen) is streamed through a pipe instead."""
HEAD = 1 << 16
"""Bytes read first from the head (the top-level members before the jobs and the first job)."""
TAIL = 1 << 16
"""Bytes of the output's end searched for the jobs array's end."""
WINDOW = 1 << 18
"""Bytes of the first window searched backwards for ids; each next one is twice as big, to CHUNK."""


class FileBuffer(_Buffer):
    """json_stream's buffer over a file read with pread: `base` is the file offset of data[0],
    and `seek` moves the reading elsewhere (the walk of the top-level object goes on there)."""

    def __init__(self, fd: int, size: int, source: str) -> None:
        super().__init__(iter(()), source)
        self.fd = fd
        self.size = size
        self.base = 0
        self.next = 0
        self.step = HEAD
        self.read_bytes = 0
        """Bytes read from the file in all (head, tail, windows): what the fetch cost in copies."""

    def more(self) -> bool:
        if self.next >= self.size:
            self.ended = True
            return False
        chunk = self.pread(self.next, min(self.next + self.step, self.size))
        self.base += self.at
        self.data = self.data[self.at :] + chunk
        self.at = 0
        self.next += len(chunk)
        self.step = min(self.step * 4, CHUNK)
        return True

    def pread(self, start: int, end: int) -> bytes:
        data = os.pread(self.fd, end - start, start)
        if len(data) != end - start:
            raise InputError(f"{self.source}: the output changed while it was read")
        self.read_bytes += len(data)
        return data

    def seek(self, offset: int) -> None:
        self.data = b""
        self.at = 0
        self.base = self.next = offset
        self.ended = False


def _from_end(
    buf: _Buffer, layout: Layout, keep: Callable[[int], bool] | Collection[int], reuse: Reuse, source: str
) -> list[Job]:
    """json_stream.Asked: the jobs of a set of ids searched from the end of a FileBuffer; what
    is not such (a callable `keep`, a pipe) or an end not laid out as expected is read forward."""
    if isinstance(buf, FileBuffer) and isinstance(keep, (set, frozenset)):
        found = _search_back(buf, layout, keep, reuse, source)
        if found is not None:
            return found
    return json_stream._asked(buf, layout, keep, reuse, source)


def _search_back(
    buf: FileBuffer, layout: Layout, wanted: Collection[int], reuse: Reuse, source: str
) -> list[Job] | None:
    """The wanted jobs found by windows from the array's end backwards (None: the end is not as
    the layout says; nothing consumed then). `buf` is at the first job's opening brace; once
    found, it is moved to the array's closing bracket, which it consumes."""
    first = buf.base + buf.at - layout.job_indent - 1  # the first job's start line (layout.start)
    stop = _array_end(buf, layout, first)
    if stop is None:
        return None
    few = len(wanted) <= FEW_IDS  # else every id line is matched and looked up
    pattern = layout.ids_line(wanted) if few else layout.id_line
    left = set(wanted)
    found: list[tuple[int, Job]] = []
    hi, size, checked = stop, WINDOW, False
    while left and hi > first:
        lo = max(first, hi - size)
        data = buf.pread(lo, hi)
        at = data.find(layout.start)  # the window's first whole job starts here
        if lo == first and at != 0:
            return None
        if at < 0:
            size *= 4  # a job longer than the window
            continue
        if not checked:  # the array's last object is a job: its own id line, once
            last = data.rfind(layout.start, at)
            if len(layout.id_line.findall(data, last)) != 1:
                return None
            checked = True
        for match in pattern.finditer(data, at):
            number = int(match.group(1))
            if not few and number not in wanted:
                continue
            begin = data.rfind(layout.start, at, match.start())
            end = data.find(layout.end, match.end())
            if end < 0:
                raise InputError(f"{source}: job {number} does not end as the jobs before it")
            cut = layout.cut(data, begin, end + len(layout.end))
            found.append((lo + begin, reuse.job(cut, f"{source}: job {number}")))
            left.discard(number)
        hi = lo + at
        size = min(size * 2, CHUNK)
    buf.seek(stop)
    buf.expect(b"]")
    return [job for _, job in sorted(found, key=lambda pair: pair[0])]


def _array_end(buf: FileBuffer, layout: Layout, first: int) -> int | None:
    """The file offset just past the last job's closing brace: the last job end followed by the
    array's closing bracket in the output's last TAIL bytes (None: none there)."""
    lo = max(first, buf.size - TAIL)
    closing = re.compile(re.escape(layout.end) + rb"[ \t\n\r]*\]")
    last = None
    for last in closing.finditer(buf.pread(lo, buf.size)):  # noqa: B007 - the last one is wanted
        pass
    return None if last is None else lo + last.start() + len(layout.end)


def command_file(cmd: SlurmCommands, name: str, args: Sequence[str], fd: int) -> int:
    """The size of the whole standard output of a Slurm command, written into `fd` (a memfd),
    once it has ended well; the errors of json_stream.command_chunks (cannot run, exit status
    and the end of its standard error, killed after the runner's timeout)."""
    shown = [name, *args]
    argv = [cmd.path(name), *args]
    with tempfile.TemporaryFile() as err:
        try:
            process = subprocess.Popen(argv, stdout=fd, stderr=err, stdin=subprocess.DEVNULL, env=dict(cmd.env()))
        except OSError as exc:
            raise CommandUnavailable(shown, f"cannot run: {exc.strerror or exc}") from None
        try:
            code = process.wait(timeout=cmd.timeout_s)
        except subprocess.TimeoutExpired:
            raise json_stream.failure(shown, -9, err, cmd.timeout_s) from None
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        if code != 0:
            raise json_stream.failure(shown, code, err, None)
    return os.fstat(fd).st_size


class Fetch:
    """`squeue --json` for a few jobs on a release that ignores the filter: through a memfd,
    read from its end (this module), or streamed through a pipe (json_stream) when the last
    output seen was larger than `limit` or no memfd can be made."""

    def __init__(self, limit: int = MEMFD_MAX) -> None:
        self.limit = limit
        self.last_size = 0
        """Bytes of the last output seen (either way)."""
        self.last_read = 0
        """Bytes of it the agent read (the whole output when streamed)."""

    def jobs(
        self, cmd: SlurmCommands, args: Sequence[str], wanted: set[int], *, source: str, reuse: Reuse
    ) -> list[Job]:
        """The jobs `wanted` of one `squeue` run with `args` (json_stream.jobs with `keep`)."""
        fd = _memfd("squeue") if self.last_size <= self.limit else None
        if fd is None:
            return json_stream.jobs(self._counted(cmd, args), source=source, keep=wanted, reuse=reuse)
        try:
            self.last_size = command_file(cmd, "squeue", args, fd)
            buf = FileBuffer(fd, self.last_size, source)
            found = json_stream.jobs_in(buf, source=source, keep=wanted, reuse=reuse, asked=_from_end)
            self.last_read = buf.read_bytes
            return found
        finally:
            os.close(fd)

    def _counted(self, cmd: SlurmCommands, args: Sequence[str]) -> Iterator[bytes]:
        size = 0
        for chunk in json_stream.command_chunks(cmd, "squeue", args):
            size += len(chunk)
            yield chunk
        self.last_size = self.last_read = size


def _memfd(name: str) -> int | None:
    """A new memfd (None where the kernel or the limits give none: the pipe is used then)."""
    try:
        return os.memfd_create(f"vjob-{name}", os.MFD_CLOEXEC)
    except (OSError, AttributeError):
        return None


__all__ = ["HEAD", "MEMFD_MAX", "TAIL", "WINDOW", "Fetch", "FileBuffer", "command_file"]
