"""The listing read at a priority recalculation (plugins.slurm.incremental; issue 37 item 1).

Every PriorityCalcPeriod Slurm moves every pending job's priority, the listing's last field:
thousands of lines change at once in that field alone, and the Listing pairs them with their
jobs' last lines in bulk instead of reading each again. What is checked: the rows then are
exactly those of the same text read from scratch (`listing`), the jobs whose Row moved (a hold,
a release) are the changed ones, and a bad priority or a job printed twice among thousands of
moved lines is still Inconsistent, naming the line. The lines are the real recording's jobs
(22.05) as the stand-in squeue prints them, renumbered into a site's worth.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from devkit.slurm_standin import listing_line
from plugins.slurm.incremental import _DIGITS as DIGITS
from plugins.slurm.incremental import Inconsistent, Listing, _priority_only, listing

FIXTURES = Path(__file__).parent / "data" / "fixtures" / "slurm"
JOBS = 3000


def _lines(count: int = JOBS) -> dict[str, str]:
    """Job id → its listing line: the recording's jobs printed by the stand-in, each copied
    under new ids (every field but the id and the priority as recorded)."""
    doc = json.loads((FIXTURES / "debian-22.05-squeue.json").read_text())
    heads = [listing_line(item).split("|", 1)[1].rpartition("|")[0] for item in doc["jobs"]]
    out = {}
    for n in range(count):
        job_id = str(100_000 + n)
        out[job_id] = f"{job_id}|{heads[n % len(heads)]}|{1000 + n}"
    return out


def _text(lines: dict[str, str]) -> str:
    return "\n".join(lines.values()) + "\n"


def _with_priority(line: str, priority: str) -> str:
    return f"{line.rpartition('|')[0]}|{priority}"


def _recalculated(lines: dict[str, str], step: int) -> dict[str, str]:
    """Every priority but a held one (0) moved by `step`, as a recalculation moves them."""
    out = {}
    for job_id, line in lines.items():
        priority = line.rpartition("|")[2]
        out[job_id] = line if priority == "0" else _with_priority(line, str(int(priority) + step))
    return out


def test_a_recalculation_moves_every_priority_and_no_row() -> None:
    lines = _lines()
    kept = Listing()
    first = dict(kept.read(_text(lines)))
    assert len(first) > JOBS // 2  # the recording's finished jobs are left out, the rest listed
    for step in (1, 7, 1):
        lines = _recalculated(lines, step)
        rows = kept.read(_text(lines))
        assert rows == listing(_text(lines)) == first
        assert kept.changed == set()


def test_holds_and_releases_among_a_recalculation_are_the_changes() -> None:
    lines = _lines()
    kept = Listing()
    kept.read(_text(lines))
    ids = sorted(kept.rows)
    held = set(ids[10:40])
    for job_id in held:
        lines[job_id] = _with_priority(lines[job_id], "0")
    lines = _recalculated(lines, 3)
    rows = dict(kept.read(_text(lines)))
    assert kept.changed == held
    assert {j for j, row in rows.items() if row[-1] == "held"} >= held
    assert rows == listing(_text(lines))
    released = set(ids[10:20])
    for job_id in released:
        lines[job_id] = _with_priority(lines[job_id], "4242")
    lines = _recalculated(lines, 2)
    again = kept.read(_text(lines))
    assert kept.changed == released
    assert all(again[j][-1] == "" for j in released) and all(again[j][-1] == "held" for j in held - released)
    assert again == listing(_text(lines))


@pytest.mark.parametrize(
    "priority",
    ["", "inf", "1e400", "1" * 21, "12a", "-5", "\u0663", "12|3", "0x10", " ", "1 2"],
)
def test_a_bad_priority_among_a_recalculation_is_inconsistent_naming_the_line(priority: str) -> None:
    lines = _lines()
    kept = Listing()
    kept.read(_text(lines))
    lines = _recalculated(lines, 1)
    bad = sorted(kept.rows)[JOBS // 3]
    lines[bad] = _with_priority(lines[bad], priority)
    with pytest.raises(Inconsistent) as raised:
        kept.read(_text(lines))
    assert f"{bad}|" in str(raised.value)
    with pytest.raises(Inconsistent):  # the same text read from scratch: the same verdict
        listing(_text(lines))
    del lines[bad]  # after it nothing was kept: the next read is a whole one
    assert kept.read(_text(lines)) == listing(_text(lines))
    assert kept.changed == set(listing(_text(lines)))


@pytest.mark.parametrize("priority", [" 7", "7 ", "0 ", " 0", "00", "9" * 20])
def test_a_padded_or_long_priority_among_a_recalculation_reads_as_from_scratch(priority: str) -> None:
    """The pattern takes a priority padded with blanks (read line by line, then: blanks are
    not digits) and 20 digits (taken unread): either way the rows are those of a whole read."""
    lines = _lines()
    kept = Listing()
    kept.read(_text(lines))
    for step in (1, 2):
        lines = _recalculated(lines, step)
        odd = sorted(kept.rows)[JOBS // 4]
        lines[odd] = _with_priority(lines[odd], priority)
        assert kept.read(_text(lines)) == listing(_text(lines))


def test_digits_after_a_padded_priority_are_not_a_new_priority() -> None:
    """ "7 " is a priority (padded), "7 3" is not: equal up to their trailing digits, the two
    lines do not pair (the key must end with the field's bar), and the new one is read."""
    lines = _lines()
    kept = Listing()
    odd = sorted(kept.read(_text(lines)))[JOBS // 5]
    lines[odd] = _with_priority(lines[odd], "7 ")
    kept.read(_text(lines))
    lines = _recalculated({j: line for j, line in lines.items() if j != odd}, 1) | {odd: f"{lines[odd]}3"}
    with pytest.raises(Inconsistent, match=f"{odd}\\|"):
        kept.read(_text(lines))


def test_a_job_printed_twice_in_a_recalculation_is_inconsistent() -> None:
    lines = _lines()
    kept = Listing()
    kept.read(_text(lines))
    twice = sorted(kept.rows)[5]
    moved = _recalculated(lines, 1)
    text = _text(moved) + _with_priority(moved[twice], "999999") + "\n"  # two new priorities, one job
    with pytest.raises(Inconsistent, match=f"job '{twice}' listed twice"):
        kept.read(text)
    kept.read(_text(lines))
    moved = _recalculated(lines, 1)
    job_id, state, rest = moved[twice].split("|", 2)
    other_state = "|".join((job_id, "SUSPENDED" if state != "SUSPENDED" else "PENDING", rest))
    with pytest.raises(Inconsistent, match=f"job '{twice}' listed twice"):
        kept.read(_text(moved) + other_state + "\n")  # its new priority and another line of it


def test_any_mix_of_moves_reads_as_the_same_text_read_from_scratch() -> None:
    """Seeded steps mixing a recalculation with holds, releases, state changes, arrivals, ends
    and now and then a bad line: the kept Listing agrees with a read from scratch each step."""
    rnd = random.Random(37)
    lines = _lines(1200)
    next_id = 200_000
    kept = Listing()
    before = dict(kept.read(_text(lines)))
    for _ in range(40):
        if rnd.random() < 0.5:
            lines = _recalculated(lines, rnd.randint(1, 5))
        ids = list(lines)
        for job_id in rnd.sample(ids, 15):
            lines[job_id] = _with_priority(lines[job_id], rnd.choice(["0", "0", "17", str(rnd.randint(1, 10**6))]))
        for job_id in rnd.sample(ids, 5):
            lines[job_id] = lines[job_id].replace("|PENDING|", "|RUNNING|", 1)
        for job_id in rnd.sample(ids, 5):
            del lines[job_id]
        for _ in range(5):
            head = rnd.choice(list(lines.values())).split("|", 1)[1]
            lines[str(next_id)] = f"{next_id}|{head}"
            next_id += 1
        text = _text(lines)
        bad = rnd.random() < 0.1
        if bad:
            text += f"{next_id}|PENDING|1|1|0M|UNLIMITED|1|N/A||1e400\n"
        try:
            expected = listing(text)
        except Inconsistent:
            with pytest.raises(Inconsistent):
                kept.read(text)
            before = {}
            continue
        rows = dict(kept.read(text))
        assert rows == expected
        assert kept.changed == {j for j, row in rows.items() if before.get(j) != row}
        before = rows


def _former_priority_only(added: set[str], gone: set[str]) -> tuple[set[str], set[str]]:
    """The pairing line by line (str.rstrip, len, endswith each), as it was before `_cut`: the
    reference the arrays must agree with."""
    ids = {line.split("|", 1)[0].strip() for line in gone}
    keys = [line.rstrip(DIGITS) for line in added]
    if len(set(keys)) != len(keys):
        return set(added), ids
    old = {line.rstrip(DIGITS): line for line in gone}
    kept = set()
    for line, key in zip(added, keys, strict=True):
        was = old.get(key)
        if was is None or not key.endswith("|") or not 1 <= len(line) - len(key) <= 20:
            continue
        if line.endswith("|0") == was.endswith("|0"):
            kept.add(key)
    if not kept:
        return set(added), ids
    return {line for line, key in zip(added, keys, strict=True) if key not in kept}, {
        key.split("|", 1)[0].strip() for key in old if key not in kept
    }


def test_the_pairing_in_arrays_agrees_with_the_lines_read_one_by_one() -> None:
    """Seeded: new and gone lines with priorities moved, held, released, padded, signed, too
    long, empty, or a line of digits alone or without a `|`: `_priority_only` (in arrays) gives
    the lines to read and the gone ids the former line-by-line pairing gave."""
    rnd = random.Random(2037)
    heads = [line.rsplit("|", 1)[0] + "|" for line in _lines(400).values()]
    odd = ["", "0", "00", "-5", " 7", "7 ", "1" * 21, "1" * 20, "12a", "+3", "1.5"]
    for _ in range(60):
        chosen = rnd.sample(heads, 200)
        gone = {h + rnd.choice(["0", str(rnd.randint(1, 10**9))]) for h in chosen}
        added = set()
        for h in chosen[: rnd.randint(0, 200)]:
            added.add(h + (rnd.choice(odd) if rnd.random() < 0.1 else rnd.choice(["0", str(rnd.randint(1, 10**12))])))
        for _ in range(rnd.randint(0, 3)):
            added.add(rnd.choice(["123", "5|x", "9|PENDING", rnd.choice(heads) + "1|2", "|"]))
        to_read, gone_ids = _priority_only(set(added), set(gone))
        assert (set(to_read), gone_ids) == _former_priority_only(added, gone)
