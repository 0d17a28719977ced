"""`squeue --json` read as a stream of bytes: never the whole document, and of each job only what vjob reads.

Why: at a site's size (120,000 jobs at 3.7-9 KB of JSON each) the listing is 0.5-1 GB of text;
`json.loads` of it holds the text and every job's dict at once, several GiB, and decoding every
job whole costs seconds of CPU. Here the command's output is read in chunks of bytes (no text
decoding of what is not read), the top-level object is walked by hand, and the "jobs" array is
read by Slurm's pretty layout (plugins.slurm.json_fields): a full read cuts out of each job the
members vjob reads and decodes those alone (and not even that for a job unchanged since the last
read, `Reuse`); a read for some jobs (`keep`) finds each job's own id line and cuts out the jobs
asked for only. Memory stays at one chunk plus the Jobs kept. (Where squeue ignores the filter,
a read for a few ids does not come here whole: plugins.slurm.json_tail searches the output from
its end, through the walk and the checks of this module.)

Nothing is taken on trust that JSON itself does not guarantee: every value read is decoded by
the json module, strictly; the layout is learnt from the first job and checked against decoding
that job whole, and an output laid out otherwise (one line, other indents) is decoded job by job;
the layout in "meta" is checked (parse_json.check_layout) wherever it comes in the document, and
output that is not one JSON object with a "jobs" array is refused as a whole.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import IO, Any

from plugins.slurm import parse_json
from plugins.slurm.commands import SlurmCommands
from plugins.slurm.json_fields import JOB_FIELDS, NODE_FIELDS, Layout, NodeReuse, Reuse, first_job_check
from vjob.errors import CommandError, CommandUnavailable, InputError
from vjob.model import Job, Node

CHUNK = 4 << 20
"""Bytes read from the command at a time."""
FEW_IDS = 256
"""Up to this many ids asked for, the id lines are matched by one pattern of those ids alone."""
WINDOW = 1 << 16
"""Bytes decoded at first for one value of the top level (or one job of an unknown layout)."""
_SPACE = re.compile(rb"[ \t\n\r]*")
_FOLLOW = re.compile(rb"[ \t\n\r]*(?:(\])|,[ \t\n\r]*(?=\{))")
"""What follows an object of an array: the array's end (consumed), or a comma and the next object
(left at its brace)."""
_DECODER = json.JSONDecoder()


class _Buffer:
    """The bytes read so far and not yet consumed, refilled from `chunks` on demand."""

    def __init__(self, chunks: Iterator[bytes], source: str) -> None:
        self.chunks = chunks
        self.source = source
        self.data = b""
        self.at = 0
        self.ended = False

    def more(self) -> bool:
        """Read one more chunk (dropping what was consumed); False at the end of the output."""
        if self.ended:
            return False
        try:
            chunk = next(self.chunks)
        except StopIteration:
            self.ended = True
            return False
        self.data = self.data[self.at :] + chunk
        self.at = 0
        return True

    def char(self) -> bytes:
        """The next byte that is not white space (b'' at the end), not consumed."""
        while True:
            self.at = _SPACE.match(self.data, self.at).end()  # type: ignore[union-attr]
            if self.at < len(self.data):
                return self.data[self.at : self.at + 1]
            if not self.more():
                return b""

    def expect(self, allowed: bytes) -> bytes:
        found = self.char()
        if not found or found not in allowed:
            said = repr(found.decode("latin-1")) if found else "the end of the output"
            raise InputError(f"{self.source}: expected one of {allowed.decode()!r} in the JSON, found {said}")
        self.at += 1
        return found

    def find(self, needle: re.Pattern[bytes], start: int) -> int:
        """Where `needle` (a literal pattern: re searches a literal prefix three times as fast as
        bytes.find searches indented JSON) ends from `start` on, reading more as needed; -1 at
        the end. `start` is kept relative to `at` while consumed bytes are dropped."""
        while True:
            found = needle.search(self.data, start)
            if found is not None:
                return found.end()
            offset = self.at
            if not self.more():
                return -1
            start = max(self.at, start - offset - len(needle.pattern))

    def value(self) -> Any:
        """The next JSON value, decoded whole: a wider window of what is read, then more chunks,
        while it is cut short."""
        self.char()
        size = WINDOW
        while True:
            whole = self.at + size >= len(self.data)
            text = self.data[self.at : self.at + size].decode("utf-8", "surrogateescape")
            try:
                value, end = _DECODER.raw_decode(text)
            except json.JSONDecodeError as exc:
                if not whole or (len(text) - exc.pos <= CHUNK and self.more()):
                    size = max(size * 4, len(self.data))
                    continue  # cut at the window's or the chunk's end: decode again with more
                raise InputError(f"{self.source}: invalid JSON: {str(exc)[:200]}") from None
            except RecursionError:
                raise InputError(f"{self.source}: JSON nested too deep") from None
            # A number at the window's end may go on after it ("12" of "123"): look again.
            if end == len(text) and not isinstance(value, (dict, list, str)) and (not whole or self.more()):
                size = max(size * 4, len(self.data))
                continue
            if text.isascii():
                self.at += end
                return value
            raw = self.data[self.at : self.at + len(text[:end].encode("utf-8", "surrogateescape"))]
            self.at += len(raw)
            replaced = raw.decode("utf-8", "replace")
            if replaced != text[:end]:  # bytes that are not UTF-8: read as the output's text was before
                value = _DECODER.raw_decode(replaced)[0]
            return value


def jobs(
    chunks: Iterable[bytes | str],
    *,
    source: str,
    keep: Callable[[int], bool] | Collection[int] | None = None,
    reuse: Reuse | None = None,
) -> list[Job]:
    """The jobs of one `squeue --json` output given as chunks; with `keep`, only the jobs whose
    id it accepts (the others are passed over by the layout, or decoded for their id and dropped).
    `reuse` keeps the Jobs between reads (json_fields.Reuse; a read of every job forgets the jobs
    it did not meet). The layout is checked once the document's "meta" has been read; a document
    that has no "jobs" array or no supported layout is refused (InputError), whatever it held."""
    return jobs_in(_Buffer(_as_bytes(chunks), source), source=source, keep=keep, reuse=reuse)


def jobs_in(
    buf: _Buffer,
    *,
    source: str,
    keep: Callable[[int], bool] | Collection[int] | None = None,
    reuse: Reuse | None = None,
    asked: Asked | None = None,
) -> list[Job]:
    """The jobs of the `squeue --json` output `buf` reads (jobs); `asked` finds the jobs `keep`
    accepts once the layout is known (default: _asked, reading on from the first job)."""
    kept = reuse or Reuse()
    found = walk(buf, source, "jobs", lambda b: _array(b, source, keep, kept, asked))
    if found is None:
        raise InputError(f"{source}: no 'jobs' list: this is not squeue --json output")
    return found


def nodes(chunks: Iterable[bytes | str], *, source: str, reuse: NodeReuse | None = None) -> list[Node]:
    """The nodes of a `sinfo --json` (openapi) or `scontrol --json show node` output, one per
    name (the first kept), read as the jobs are; `reuse` gives back unchanged nodes' objects."""
    kept = reuse or NodeReuse()

    def read(buf: _Buffer) -> list[Node]:
        buf.expect(b"[")
        if buf.char() == b"]":
            buf.at += 1
            return []
        layout = learn(buf, NODE_FIELDS)
        if layout is not None:
            return _every(buf, layout, kept.node, source, "nodes")
        out = []
        while True:
            out.append(parse_json.node(buf.value(), f"{source}: nodes[{len(out)}]"))
            if buf.expect(b",]") == b"]":
                return out

    found = _document(chunks, source, "nodes", read)
    if found is None:
        raise InputError(f"{source}: no 'nodes' list: this is not sinfo/scontrol show node --json output")
    by_name: dict[str, Node] = {}
    for node in found:
        by_name.setdefault(node.name, node)
    kept.keep_only(found)
    return list(by_name.values())


def _document(chunks: Iterable[bytes | str], source: str, key: str, read: Callable[[_Buffer], list[Any]]) -> Any:
    """The top-level object of `chunks` walked by hand (walk)."""
    return walk(_Buffer(_as_bytes(chunks), source), source, key, read)


def walk(buf: _Buffer, source: str, key: str, read: Callable[[_Buffer], list[Any]]) -> Any:
    """The top-level object walked by hand: `read` reads the array under `key` (None: no such
    member), "meta" is decoded and checked once the object has ended, the rest passed over."""
    buf.expect(b"{")
    found: list[Any] | None = None
    meta: Any = None
    if buf.char() == b"}":
        buf.at += 1
    else:
        while True:
            name = buf.value()
            if not isinstance(name, str):
                raise InputError(f"{source}: a JSON key that is not a string")
            buf.expect(b":")
            if name == key and found is None:
                found = read(buf)
            elif name == "meta" and meta is None:
                meta = buf.value()
            else:
                buf.value()  # errors, warnings, last_update, ...: small, not read
            if buf.expect(b",}") == b"}":
                break
    if buf.char():
        raise InputError(f"{source}: text after the JSON object")
    parse_json.check_layout({"meta": meta} if meta is not None else {}, source=source)
    return found


def _as_bytes(chunks: Iterable[bytes | str]) -> Iterator[bytes]:
    for chunk in chunks:
        yield chunk.encode("utf-8", "surrogatepass") if isinstance(chunk, str) else chunk


Asked = Callable[[_Buffer, Layout, Callable[[int], bool] | Collection[int], Reuse, str], list[Job]]
"""How the jobs asked for are found once the layout is known (_asked; json_tail searches from the end)."""


def _array(
    buf: _Buffer,
    source: str,
    keep: Callable[[int], bool] | Collection[int] | None,
    reuse: Reuse | None,
    asked: Asked | None = None,
) -> list[Job]:
    """The elements of the "jobs" array: by Slurm's layout where the first job shows it (learn),
    else each decoded whole and read (parse_json.job) on its own."""
    buf.expect(b"[")
    if buf.char() == b"]":
        buf.at += 1
        return []
    layout = learn(buf, JOB_FIELDS)
    if layout is not None and keep is not None:
        return (asked or _asked)(buf, layout, keep, reuse or Reuse(), source)
    if layout is not None:
        kept = reuse or Reuse()
        kept.begin_full()
        every = _every(buf, layout, kept.job, source, "jobs")
        kept.end_full()
        return every
    out: list[Job] = []
    index = 0
    while True:
        where = f"{source}: jobs[{index}]"
        item = buf.value()
        number = parse_json.job_id(item, where) if keep is not None else 0
        if keep is None or (keep(number) if callable(keep) else number in keep):
            out.append(parse_json.job(item, where))
        index += 1
        if buf.expect(b",]") == b"]":
            return out


def learn(buf: _Buffer, fields: tuple[str, ...] = JOB_FIELDS) -> Layout | None:
    """The layout of the first job in `buf` (at its opening brace): its indent and its members',
    None when it is not Slurm's pretty layout or reading it so does not give what decoding the
    whole job gives (json_fields.first_job_check). Nothing is consumed."""
    start = buf.at
    line = buf.data.rfind(b"\n", 0, start)
    indent = buf.data[line + 1 : start] if line >= 0 else b""
    if not indent or indent.strip(b" "):
        return None
    while len(buf.data) - buf.at < 256 and buf.more():
        pass
    start = buf.at
    key = re.match(rb'\{\n( +)"', buf.data[start : start + 256])
    if key is None or len(key.group(1)) <= len(indent):
        return None
    layout = Layout(len(indent), len(key.group(1)), fields)
    end = buf.find(layout.end_line, start)
    start = buf.at  # find may have dropped consumed bytes: positions are from here
    if end < 0:
        return None
    text = buf.data[start:end].decode("utf-8", "replace")
    try:
        whole, decoded = _DECODER.raw_decode(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    if decoded != len(text):  # the decoder ends the job elsewhere than the layout does
        return None
    return layout if first_job_check(layout, buf.data, start, end, whole) else None


def _every(buf: _Buffer, layout: Layout, make: Callable[[Any, str], Any], source: str, what: str) -> list[Any]:
    """Every object of the array, by the layout: its end found, its members cut out and made
    into a Job or a Node by `make` (json_fields.Reuse.job, NodeReuse.node)."""
    out: list[Any] = []
    while True:
        where = f"{source}: {what}[{len(out)}]"
        end = buf.find(layout.end_line, buf.at)
        if end < 0:
            raise InputError(f"{where}: the JSON ends inside it")
        out.append(make(layout.cut(buf.data, buf.at, end), where))
        follow = _FOLLOW.match(buf.data, end)  # in one step what the lines below read
        if follow is not None:
            buf.at = follow.end()
            if follow.group(1):
                return out
            continue
        buf.at = end  # the next object or the list's end is past this chunk, or is not there
        if buf.expect(b",]") == b"]":
            return out
        if buf.char() != b"{":
            raise InputError(f"{source}: {what}[{len(out)}] is not a JSON object")


def _asked(
    buf: _Buffer, layout: Layout, keep: Callable[[int], bool] | Collection[int], reuse: Reuse, source: str
) -> list[Job]:
    """The jobs `keep` accepts (or a few ids: `keep` a set), found by their own id lines
    (json_fields.Layout.id_line: a job's `"job_id": N` at its members' indent), cut out between
    the job's opening and closing braces; the others are passed over without being decoded. Each
    round reads the jobs before the last one the buffer holds (that one may go on in the next
    chunk); once the output has ended, the list's end (the first job end followed by its closing
    bracket) bounds the last round, and the walk of the document goes on from it."""
    if isinstance(keep, (set, frozenset)) and len(keep) <= FEW_IDS:
        pattern = layout.ids_line(keep)  # re matches only these ids: no Python step per job
        accept: Callable[[int], bool] = lambda _: True  # noqa: E731
    else:
        pattern = layout.id_line
        accept = keep if callable(keep) else frozenset(keep).__contains__
    prefix = layout.id_line.pattern[: layout.key_indent + 1] + b'"job_id": '
    out: list[Job] = []
    while True:
        ended = not buf.more()
        if ended:
            closing = re.compile(re.escape(layout.end) + rb"[ \t\n\r]*\]").search(buf.data, buf.at)
            if closing is None:
                raise InputError(f"{source}: the JSON ends inside the jobs list")
            stop = closing.start() + len(layout.end)
        else:  # up to the start of the job of the last id line: the jobs before it are whole
            last = buf.data.rfind(prefix, buf.at)
            stop = max(buf.at, buf.data.rfind(layout.start, buf.at, last) + 1) if last >= 0 else buf.at
        for match in pattern.finditer(buf.data, buf.at, stop):
            number = int(match.group(1))
            if not accept(number):
                continue
            begin = buf.data.rfind(layout.start, buf.at, match.start())  # -1: the round's first job
            end = buf.data.find(layout.end, match.end(), stop)
            if end < 0:
                raise InputError(f"{source}: job {number} does not end as the jobs before it")
            cut = layout.cut(buf.data, buf.at if begin < 0 else begin, end + len(layout.end))
            out.append(reuse.job(cut, f"{source}: job {number}"))
        buf.at = stop
        if ended:
            buf.expect(b"]")
            return out


def command_chunks(cmd: SlurmCommands, name: str, args: Sequence[str]) -> Iterator[bytes]:
    """The standard output of a Slurm command as chunks of bytes, as it is printed; a
    CommandError naming the command when it fails, cannot run or outlives the runner's timeout
    (it is killed then). Standard error goes to a temporary file, read only for the message."""
    shown = [name, *args]
    argv = [cmd.path(name), *args]
    with tempfile.TemporaryFile() as err:
        try:
            process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=dict(cmd.env())
            )
        except OSError as exc:
            raise CommandUnavailable(shown, f"cannot run: {exc.strerror or exc}") from None
        killed = threading.Event()
        timer = threading.Timer(cmd.timeout_s, lambda: (killed.set(), process.kill()))
        timer.start()
        try:
            assert process.stdout is not None
            while block := process.stdout.read(CHUNK):
                yield block
            code = process.wait()
        finally:
            timer.cancel()
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        if code != 0:
            raise failure(shown, code, err, cmd.timeout_s if killed.is_set() else None)


def failure(shown: list[str], code: int, err: IO[bytes], killed_after: float | None) -> CommandError:
    """The error of a command that failed: killed after `killed_after` seconds (no complete
    answer), else its exit status and the last lines of its standard error (`err`)."""
    if killed_after is not None:
        return CommandUnavailable(shown, f"no complete answer within {killed_after:g} s; killed (is slurmctld up?)")
    err.seek(0)
    lines = (err.read(4000).decode(errors="replace").strip() or "(no message)").splitlines()
    return CommandError(shown, f"exit status {code}: {' / '.join(lines[-3:])[-400:]}")


__all__ = ["Asked", "command_chunks", "failure", "jobs", "jobs_in", "learn", "nodes", "walk"]
