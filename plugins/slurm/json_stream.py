"""`squeue --json` read as a stream: one job object decoded at a time, never the whole document.

Why: at a site's size (120,000 jobs at 3.7-9 KB of JSON each) the listing is 0.5-1 GB of text;
`json.loads` of it holds the text and every job's dict at once, several GiB, before a single
Job is made. Here the command's output is read in chunks, the top-level object is walked by
hand and each element of its "jobs" array is decoded by the standard C decoder
(`raw_decode`) and handed on; memory stays at one chunk plus the Jobs kept.

Nothing is taken on trust that JSON itself does not guarantee: keys and values are decoded by
the json module (a job name is one JSON string, whatever it holds), the layout in "meta" is
checked (parse_json.check_layout) wherever it comes in the document, and output that is not one
JSON object with a "jobs" array is refused as a whole.
"""

from __future__ import annotations

import codecs
import json
import re
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from plugins.slurm import parse_json
from plugins.slurm.commands import SlurmCommands
from vjob.errors import CommandError, CommandUnavailable, InputError
from vjob.model import Job

CHUNK = 1 << 20
"""Bytes read from the command at a time."""
_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _Buffer:
    """The text read so far and not yet consumed, refilled from `chunks` on demand."""

    def __init__(self, chunks: Iterator[str], source: str) -> None:
        self.chunks = chunks
        self.source = source
        self.text = ""
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
        self.text = self.text[self.at :] + chunk
        self.at = 0
        return True

    def char(self) -> str:
        """The next character that is not white space ('' at the end), not consumed."""
        while True:
            self.at = _SPACE.match(self.text, self.at).end()  # type: ignore[union-attr]
            if self.at < len(self.text):
                return self.text[self.at]
            if not self.more():
                return ""

    def expect(self, allowed: str) -> str:
        found = self.char()
        if not found or found not in allowed:
            said = repr(found) if found else "the end of the output"
            raise InputError(f"{self.source}: expected one of {allowed!r} in the JSON, found {said}")
        self.at += 1
        return found

    def value(self) -> Any:
        """The next JSON value, decoded whole (more chunks read while it is cut short)."""
        self.char()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.at)
            except json.JSONDecodeError as exc:
                if len(self.text) - exc.pos <= CHUNK and self.more():
                    continue  # cut at a chunk's end: decode again with more text
                raise InputError(f"{self.source}: invalid JSON: {str(exc)[:200]}") from None
            except RecursionError:
                raise InputError(f"{self.source}: JSON nested too deep") from None
            # A number at the buffer's end may go on in the next chunk ("12" of "123"): look again.
            if end == len(self.text) and not isinstance(value, (dict, list, str)) and self.more():
                continue
            self.at = end
            return value


def jobs(chunks: Iterable[str], *, source: str, keep: Callable[[int], bool] | None = None) -> list[Job]:
    """The jobs of one `squeue --json` output given as text chunks; with `keep`, only the jobs
    whose id it accepts are turned into Jobs (the others are decoded, checked for an id, and
    dropped). The layout is checked once the document's "meta" has been read; a document that
    has no "jobs" array or no supported layout is refused (InputError), whatever it held."""
    buf = _Buffer(iter(chunks), source)
    buf.expect("{")
    found: list[Job] | None = None
    meta: Any = None
    if buf.char() == "}":
        buf.at += 1
    else:
        while True:
            key = buf.value()
            if not isinstance(key, str):
                raise InputError(f"{source}: a JSON key that is not a string")
            buf.expect(":")
            if key == "jobs" and found is None:
                found = _array(buf, source, keep)
            elif key == "meta" and meta is None:
                meta = buf.value()
            else:
                buf.value()  # errors, warnings, last_update, ...: small, not read
            if buf.expect(",}") == "}":
                break
    if buf.char():
        raise InputError(f"{source}: text after the JSON object")
    parse_json.check_layout({"meta": meta} if meta is not None else {}, source=source)
    if found is None:
        raise InputError(f"{source}: no 'jobs' list: this is not squeue --json output")
    return found


def _array(buf: _Buffer, source: str, keep: Callable[[int], bool] | None) -> list[Job]:
    """The elements of the "jobs" array, each decoded and read (parse_json.job) on its own;
    with `keep`, the elements it refuses are skipped by Slurm's layout where it can (_Skipper)."""
    out: list[Job] = []
    buf.expect("[")
    if buf.char() == "]":
        buf.at += 1
        return out
    skipper = _Skipper.of(buf) if keep is not None else None
    index = 0
    while True:
        where = f"{source}: jobs[{index}]"
        if keep is not None and skipper is not None and skipper.skip(buf, keep):
            pass
        else:
            item = buf.value()
            if keep is None:
                out.append(parse_json.job(item, where))
            elif keep(parse_json.job_id(item, where)):
                out.append(parse_json.job(item, where))
        index += 1
        if buf.expect(",]") == "]":
            return out


class _Skipper:
    """Passing over the jobs that were not asked for without decoding them, by the layout Slurm
    prints: each job object starts on its own line at one indent and its closing brace is alone
    at that same indent, its keys one indent deeper. JSON keeps line breaks out of strings (a
    job name's is written \\n), so a line break followed by exactly that indent and a brace can
    only be the end of the job object, and `"job_id": N` at the key indent only its own id: no
    text a user wrote can move either. The indents are learnt from the first job, whose end
    found so must be where the decoder ends it; output laid out otherwise (one line, other
    indents) is decoded job by job as before."""

    def __init__(self, end: str, key: str) -> None:
        self.end = end
        self.key = key
        self.id_at = re.compile(re.escape(key) + r'"job_id": ([0-9]{1,10}),?\n')

    @classmethod
    def of(cls, buf: _Buffer) -> _Skipper | None:
        """The layout of the first job in `buf` (at its opening brace), None when it is not
        Slurm's pretty layout or its end found so is not the decoder's."""
        line = buf.text.rfind("\n", 0, buf.at)
        indent = buf.text[line + 1 : buf.at] if line >= 0 else None
        if not indent or indent.strip(" "):
            return None
        first = buf.text[buf.at : buf.at + 256]
        key = re.match(r"\{\n( +)\"", first)
        if key is None or len(key.group(1)) <= len(indent):
            return None
        skipper = cls("\n" + indent + "}", "\n" + key.group(1))
        end = skipper._end(buf)
        start = buf.at  # _end may have dropped consumed text: positions are from here
        if end is None:
            return None
        try:
            _, decoded = _DECODER.raw_decode(buf.text, start)
        except (json.JSONDecodeError, RecursionError):
            return None
        buf.at = start
        return skipper if decoded == end else None

    def _end(self, buf: _Buffer) -> int | None:
        """Where the job object at `buf.at` ends (just past its brace), reading more as needed."""
        while True:
            found = buf.text.find(self.end, buf.at)
            if found >= 0:
                return found + len(self.end)
            if not buf.more():
                return None

    def skip(self, buf: _Buffer, keep: Callable[[int], bool]) -> bool:
        """Pass over the job object at `buf.at` when its id is one `keep` refuses; False (nothing
        consumed) when it is wanted or its id cannot be read by the layout: decode it then."""
        if buf.char() != "{":
            return False
        end = self._end(buf)
        start = buf.at  # _end may have dropped consumed text: positions are from here
        if end is None:
            return False
        found = self.id_at.search(buf.text, start, end)
        if found is None or keep(int(found.group(1))):
            return False
        buf.at = end
        return True


def command_chunks(cmd: SlurmCommands, name: str, args: Sequence[str]) -> Iterator[str]:
    """The standard output of a Slurm command as text chunks, as it is printed; a CommandError
    naming the command when it fails, cannot run or outlives the runner's timeout (it is
    killed then). Standard error goes to a temporary file, read only for the message."""
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
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            assert process.stdout is not None
            while block := process.stdout.read(CHUNK):
                yield decoder.decode(block)
            yield decoder.decode(b"", final=True)
            code = process.wait()
        finally:
            timer.cancel()
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        if code != 0:
            if killed.is_set():
                raise CommandUnavailable(
                    shown, f"no complete answer within {cmd.timeout_s:g} s; killed (is slurmctld up?)"
                )
            err.seek(0)
            lines = (err.read(4000).decode(errors="replace").strip() or "(no message)").splitlines()
            raise CommandError(shown, f"exit status {code}: {' / '.join(lines[-3:])[-400:]}")


__all__ = ["command_chunks", "jobs"]
