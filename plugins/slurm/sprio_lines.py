"""Slurm's `sprio` read tick after tick: a line printed as it was last time is not read again.

Why: at a site's size sprio lists 100,000 pending jobs, and splitting and checking every field
of every line cost the agent about 0.3 s of CPU a tick. Slurm does not recompute what sprio
shows at every scheduling pass: priority/multifactor keeps each job's factors
(`job_ptr->prio_factors`) and recomputes them in its decay thread once every
`PriorityCalcPeriod` (5 minutes by default, slurm.conf(5)), or for one job when it is submitted
or updated (a new site factor from vjob); sprio copies what is kept. Between two recalculations
nearly every line is byte for byte the one of the tick before. So the lines are compared as a
whole (one set difference, in C) and only the new ones are read, in one block when every one of
them is plain (digits and `|`, the common case), else one by one with the checks of `parse_line`
(a finite ASCII number per factor, the field named when not). A line's reading depends on the
line alone, so what was read of a line is kept as long as the line is printed.

What sprio prints twice: a job pending in several partitions has one line per partition; the
last one printed counts (as the whole read, `factors`, does), found by reading the lines in
order when any id is printed twice.
"""

from __future__ import annotations

import math
import operator
import re
from collections import deque
from collections.abc import Collection, Sequence
from itertools import repeat

import numpy as np

from vjob.errors import CommandError

SPRIO_ARGS = ("-h", "-o", "%i|%Y|%S|%P|%J|%N|%Q|%A|%F")
"""sprio's arguments: job id, priority, site factor, then the site's weighted factors."""
NAMES = ("priority", "site", "partition", "jobsize", "nice", "qos", "age", "fairshare")
"""The factors of a line after its job id, in SPRIO_ARGS' order."""
_NUMBER = re.compile(r"-?[0-9]{1,20}(\.[0-9]{0,20})?([eE][-+]?[0-9]{1,3})?")
"""A factor as sprio prints it (ASCII only: float() also takes other scripts' digits)."""
_PLAIN_DIGITS = 20
"""A plain field's most digits: `parse_line` reads up to 20 digits as int(), refuses more."""


def parse_line(line: str, number: int) -> tuple[str, dict[str, int]]:
    """The job id and factors of one sprio line (`number` for the error: the first line is 1)."""
    parts = [p.strip() for p in line.split("|")]
    if len(parts) != len(NAMES) + 1:
        raise CommandError(["sprio"], f"line {number}: expected {len(NAMES) + 1} fields, got {line!r}")
    row: dict[str, int] = {}
    for name, value in zip(NAMES, parts[1:], strict=True):
        if value.isascii() and value.isdigit() and len(value) <= 20:
            row[name] = int(value)  # the common case, without the checks below
            continue
        # float() then int(): sprio prints factors as decimals. `inf` and `1e400` made
        # int() raise OverflowError, which ended the caller (fuzzed): only finite
        # ASCII numbers pass, and the error names the factor.
        try:
            number_value = float(value) if _NUMBER.fullmatch(value) else math.nan
        except ValueError:
            number_value = math.nan
        if not math.isfinite(number_value):
            raise CommandError(["sprio"], f"line {number}: {name} = {value[:40]!r}: not a number")
        row[name] = int(number_value)
    return parts[0], row


def factors(text: str) -> dict[str, dict[str, int]]:
    """Every line of `text` read: job id → its factors (NAMES), in the order printed."""
    out: dict[str, dict[str, int]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        job_id, row = parse_line(line, number)
        out[job_id] = row
    return out


class SprioLines:
    """The pending jobs' own priority (PRIORITY − SITE) from sprio's lines, read by change.

    Kept between reads: the lines printed (a set) and job id → own priority, nothing per line:
    a line that is no longer printed gives its job id back from its own text, and at a size
    where every dict of 100,000 entries costs tens of ms each one left out counts."""

    def __init__(self) -> None:
        self.new_lines = 0
        """How many lines the last read had to read (not printed the time before)."""
        self._own: dict[str, int] = {}
        """Job id → its priority without vjob's site factor, for every job of the last read."""
        self._printed: set[str] = set()
        """The lines of the last read."""
        self._frozen: dict[str, int] = {}

    def read(self, text: str) -> dict[str, int]:
        """Job id → own priority of every job sprio's `text` lists, as `factors` gives them (a
        dict no later read changes: the same object while nothing moved). CommandError, and
        nothing kept, when a new line is not a sprio line, naming the first such line as
        `factors` would."""
        lines = text.splitlines()
        now = set(lines)
        added = now.difference(self._printed)  # set to set, in C: the cheapest compare
        ids, values = _read_block(list(added), lines)
        gone = self._printed.difference(now) if len(self._printed) + len(added) != len(now) else ()
        own = self._own
        if gone and 2 * len(gone) > len(self._printed) and len(own) == len(self._printed):
            # most lines moved (a recalculation) and each job had one line: keep the few kept
            kept = _ids(self._printed.intersection(now))
            self._own = own = dict(zip(kept, map(own.__getitem__, kept), strict=True))
        elif gone:
            deque(map(own.pop, _ids(gone), repeat(None)), maxlen=0)
        own.update(zip(ids, values, strict=True))
        moved = bool(added or gone)
        if len(own) != len(now):  # an id printed twice (a job in two partitions): the last line counts
            ids, values = _read_block(lines, lines)
            self._own = own = dict(zip(ids, values, strict=True))
            moved = own != self._frozen
        self._printed = now
        self.new_lines = len(added)
        if moved:
            self._frozen = dict(own)
        return self._frozen


def _ids(lines: Collection[str]) -> list[str]:
    """The job ids of lines read before (nine fields each, the id first, stripped as
    `parse_line` strips it)."""
    if not lines:
        return []
    flat = "\n".join(lines).replace("\n", "|").split("|")
    return list(map(str.strip, flat[0 :: len(NAMES) + 1]))


def _read_block(added: list[str], lines: Sequence[str]) -> tuple[list[str], list[int]]:
    """The job ids of the lines `added` and their PRIORITY − SITE, in that order. Plain lines are
    read in one block (the split and int() in C); any other line makes every new line go
    through `parse_line`, in the order printed (`lines`), so that the error names the first bad
    line by its number."""
    if not added:
        return [], []
    block = "\n".join(added)
    raw, cut = _plain(block, len(added))
    if cut is not None:
        found = _in_arrays(raw, cut, len(added))
        if found is not None:
            return found
        flat = block.replace("\n", "|").split("|")
        step = len(NAMES) + 1
        return flat[0::step], list(map(operator.sub, map(int, flat[1::step]), map(int, flat[2::step])))
    new = set(added)
    ids: list[str] = []
    values: list[int] = []
    for number, line in enumerate(lines, 1):
        if line in new:
            job_id, row = parse_line(line, number)
            ids.append(job_id)
            values.append(row["priority"] - row["site"])
    return ids, values


def _plain(block: str, count: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The bytes of `block` (`count` lines joined by newlines) and, when every line is plain,
    the place of each field's end but the last: nine fields of 1 to 20 ASCII digits each, which
    `parse_line` reads as int(field) (a longer field, a sign, a blank, a decimal go line by
    line). Checked over the block's bytes in arrays: a pattern matched line by line cost more
    than reading the lines."""
    raw = np.frombuffer(block.encode("utf-8", "replace"), dtype=np.uint8)  # not ASCII: not plain
    if raw.size == 0:
        return raw, None
    cut = np.flatnonzero(np.subtract(raw, ord("0"), dtype=np.uint8) >= 10)  # every byte not a digit
    fields = len(NAMES) + 1
    if cut.size != fields * count - 1:
        return raw, None
    seps = raw[cut]
    newline = np.flatnonzero(seps == ord("\n"))
    if newline.size != count - 1 or not np.array_equal(newline, np.arange(fields - 1, cut.size, fields)):
        return raw, None
    if np.count_nonzero(seps == ord("|")) != (fields - 1) * count:
        return raw, None
    widths = np.diff(cut, prepend=-1, append=raw.size) - 1  # each field's digits
    return raw, cut if widths.min() >= 1 and widths.max() <= _PLAIN_DIGITS else None


def _in_arrays(raw: np.ndarray, cut: np.ndarray, count: int) -> tuple[list[str], list[int]] | None:
    """The job ids and PRIORITY − SITE of `count` plain lines (`raw`, their fields' ends `cut`
    from `_plain`) read in arrays: at a recalculation (100,000 new lines) splitting every field
    into a str and int() of two of them cost 45 ms of CPU. None when the priority or the site
    factor has more than 18 digits (int64 holds those exactly; int() reads the others)."""
    ends = np.append(cut, raw.size).reshape(count, len(NAMES) + 1)
    priority = _digits(raw, ends[:, 0] + 1, ends[:, 1])
    site = _digits(raw, ends[:, 1] + 1, ends[:, 2])
    if priority is None or site is None:
        return None
    drop = np.zeros(raw.size + 1, dtype=np.int8)  # all but each id and the newline after its line
    drop[ends[:, 0]] = 1
    drop[ends[:, -1]] = -1
    np.cumsum(drop, out=drop)
    drop ^= 1  # 1 where a byte is kept (in place: at 5 MB, every array made costs page faults)
    ids = raw[drop[:-1].view(np.bool_)].tobytes().decode("ascii").split("\n")
    return ids, (priority - site).tolist()


def _digits(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
    """The numbers of the digit fields raw[starts:ends] (1 to 18 digits each), else None."""
    widths = ends - starts
    if int(widths.max()) > _EXACT_DIGITS:
        return None
    value = np.zeros(starts.size, dtype=np.int64)
    for place in range(int(widths.max())):
        more = place < widths
        digit = raw[np.where(more, starts + place, 0)].astype(np.int64) - ord("0")
        value = np.where(more, value * 10 + digit, value)
    return value


_EXACT_DIGITS = 18
"""The most digits of a number read in int64 (below 2**63 whatever the digits)."""
