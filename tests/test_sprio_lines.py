"""sprio read by change (plugins.slurm.sprio_lines) gives what reading every line gives.

Why: the agent reads sprio every tick for the site's own priorities; at a site's size only the
lines not printed the tick before are read (issue 37). What is checked, against
`sprio_lines.factors` (every line read, the former path, the strict checks):

* seeded sequences of sprio tables moving as a site's do (jobs arriving and starting, vjob's
  site factor changing a few jobs, a recalculation moving every line, a job pending in two
  partitions with one line each, lines printed twice, padded fields, decimals, negative site
  factors, 19 and 20 digit factors): the same own priority (PRIORITY − SITE) for every job;
* lines read: none when sprio prints what it printed before, only the new ones otherwise;
* a new line `factors` refuses (`inf`, `1e400`, 21 digits, `nan`, a field missing, other
  scripts' digits) is refused with the very message of `factors` (its line number, its
  field), among lines kept from before; nothing of that read is kept, the next read is right;
* what a read returned stays as it was after later reads;
* any table after any table (fuzzed, the fields of tests/test_rms_command_output_fuzz.py):
  the same own priorities or the same error as the whole read.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.slurm.sprio_lines import SprioLines, factors
from tests.test_rms_command_output_fuzz import FUZZ, sprio_tables
from vjob.errors import CommandError

SEEDS = range(30)


def _own(text: str) -> dict[str, int]:
    return {job: row["priority"] - row["site"] for job, row in factors(text).items()}


class Site:
    """A queue of pending jobs as sprio prints it, moved on by seeded random steps."""

    def __init__(self, rnd: random.Random, jobs: int) -> None:
        self.rnd = rnd
        self.next_id = 1000
        self.jobs: dict[int, list[int]] = {}  # id -> [site, age, fairshare, partition, extra partition]
        for _ in range(jobs):
            self.arrive()

    def arrive(self) -> None:
        rnd = self.rnd
        self.jobs[self.next_id] = [0, rnd.randrange(100), rnd.randrange(1000), rnd.choice((0, 500)), 0]
        self.next_id += 1

    def step(self) -> None:
        rnd = self.rnd
        kind = rnd.choice(("churn", "churn", "site", "recalc", "same", "partition", "odd", "order"))
        if kind == "churn":
            for job in rnd.sample(sorted(self.jobs), min(len(self.jobs), rnd.randrange(0, 4))):
                del self.jobs[job]
            for _ in range(rnd.randrange(0, 4)):
                self.arrive()
        elif kind == "site" and self.jobs:
            for job in rnd.sample(sorted(self.jobs), min(len(self.jobs), 3)):
                self.jobs[job][0] = rnd.choice((0, 1000, 25_000, -300))
        elif kind == "recalc":
            for factors_of in self.jobs.values():
                if rnd.random() < 0.2:
                    continue  # at PriorityMaxAge, its fair share unchanged: the same line
                factors_of[1] += 1
                factors_of[2] = max(0, factors_of[2] + self.rnd.randrange(-5, 6))
        elif kind == "partition" and self.jobs:
            job = rnd.choice(sorted(self.jobs))
            self.jobs[job][4] = 0 if self.jobs[job][4] else rnd.choice((300, 700))
        elif kind == "order":  # the same lines in another order: which line of a job is last moves
            self.jobs = dict(rnd.sample(sorted(self.jobs.items()), len(self.jobs)))
        elif kind == "odd" and self.jobs:
            job = rnd.choice(sorted(self.jobs))
            self.jobs[job][2] = rnd.choice((10**18, 5 * 10**19, 7))  # 19 and 20 digits

    def text(self) -> str:
        rnd = self.rnd
        lines = []
        for job, (site, age, fair, part, other) in self.jobs.items():
            for partition in (part, other) if other else (part,):
                prio = 1000 + site + age + fair + partition
                fields = [str(job), str(prio), str(site), str(partition), "0", "0", "0", str(age), str(fair)]
                if rnd.random() < 0.03:
                    fields[7] = f"{age}.0"  # sprio prints some factors as decimals
                if rnd.random() < 0.03:
                    fields[0] = f"  {job}"  # padded (a width in the format)
                lines.append("|".join(fields))
        if lines and rnd.random() < 0.1:
            lines.append(rnd.choice(lines))  # the same line twice
        return "\n".join(lines) + ("\n" if lines else "")


@pytest.mark.parametrize("seed", SEEDS)
def test_read_by_change_gives_every_job_the_own_priority_of_a_whole_read(seed: int) -> None:
    rnd = random.Random(seed)
    site = Site(rnd, rnd.randrange(0, 60))
    sprio = SprioLines()
    kept: list[tuple[dict[str, int], dict[str, int]]] = []
    for _ in range(25):
        text = site.text()
        own = sprio.read(text)
        expected = _own(text)
        assert own == expected
        kept.append((own, dict(expected)))
        site.step()
    assert all(own == copy for own, copy in kept)  # later reads did not change an earlier answer


def test_only_new_lines_are_read() -> None:
    lines = [f"{j}|{1000 + j}|0|0|0|0|0|{j}|1000" for j in range(1, 501)]
    sprio = SprioLines()
    first = sprio.read("\n".join(lines) + "\n")
    assert sprio.new_lines == 500
    assert sprio.read("\n".join(lines) + "\n") is first and sprio.new_lines == 0
    lines = lines[3:] + [f"{j}|{1000 + j}|0|0|0|0|0|{j}|1000" for j in (600, 601)]
    assert lines[10] == "14|1014|0|0|0|0|0|14|1000"
    lines[10] = "14|6014|5000|0|0|0|0|14|1000"  # vjob's site factor moved: its own priority did not
    now = sprio.read("\n".join(lines) + "\n")
    assert sprio.new_lines == 3 and now == _own("\n".join(lines))
    assert "1" not in now and now["600"] == 1600 and now["14"] == 1014 and first["1"] == 1001


BAD_FIELDS = ["inf", "1e400", "1" * 21, "nan", "٣", "", "12a", "-", "1.5e3x", "\ud800"]


@pytest.mark.parametrize("bad", BAD_FIELDS)
def test_a_new_bad_line_is_refused_as_the_whole_read_refuses_it_and_nothing_is_kept(bad: str) -> None:
    good = [f"{j}|{2000 + j}|0|0|0|0|0|{j}|2000" for j in range(1, 41)]
    sprio = SprioLines()
    before = sprio.read("\n".join(good) + "\n")
    lines = [*good[:20], f"77|{bad}|0|0|0|0|0|1|1", *good[20:], f"78|1|0|0|0|0|{bad}|1|1"]
    text = "\n".join(lines) + "\n"
    with pytest.raises(CommandError) as whole:
        factors(text)
    with pytest.raises(CommandError) as by_change:
        sprio.read(text)
    assert str(by_change.value) == str(whole.value)
    assert "line 21" in str(by_change.value)  # the first bad line, counted among all lines
    assert sprio.read("\n".join(good) + "\n") == before and sprio.new_lines == 0


def test_a_line_with_a_field_missing_is_refused_naming_it() -> None:
    sprio = SprioLines()
    sprio.read("1|10|0|0|0|0|0|5|5\n")
    text = "1|10|0|0|0|0|0|5|5\n2|10|0|0|0|0|5|5\n"
    with pytest.raises(CommandError, match="line 2: expected 9 fields") as by_change:
        sprio.read(text)
    with pytest.raises(CommandError) as whole:
        factors(text)
    assert str(by_change.value) == str(whole.value)


def test_the_last_line_of_a_job_in_two_partitions_counts_as_in_the_whole_read() -> None:
    sprio = SprioLines()
    text = "5|1500|0|500|0|0|0|0|1000\n6|900|0|0|0|0|0|0|900\n5|1300|0|300|0|0|0|0|1000\n"
    assert sprio.read(text) == _own(text) == {"5": 1300, "6": 900}
    moved = "5|1300|0|300|0|0|0|0|1000\n6|900|0|0|0|0|0|0|900\n5|1500|0|500|0|0|0|0|1000\n"
    assert sprio.read(moved) == _own(moved) == {"5": 1500, "6": 900}
    one = "6|900|0|0|0|0|0|0|900\n5|1500|0|500|0|0|0|0|1000\n"
    assert sprio.read(one) == {"5": 1500, "6": 900} and sprio.new_lines == 0


@pytest.mark.parametrize(
    "new",
    [
        "1|2|3|4|5|6|7|8.9",  # eight fields, as many cuts as nine plain ones
        "1|2|3|4|5|6|7|8|9|10\n2|2|3|4|5|6|7|8",  # ten fields then eight
        "",  # a blank line
        "3|2|3|4|5|6|7|8|9\n\n4|2|3|4|5|6|7|8|9",
    ],
)
def test_lines_that_only_look_plain_are_refused_as_the_whole_read_refuses_them(new: str) -> None:
    sprio = SprioLines()
    sprio.read("9|2|3|4|5|6|7|8|9\n")
    text = "9|2|3|4|5|6|7|8|9\n" + new + "\n"
    with pytest.raises(CommandError) as whole:
        factors(text)
    with pytest.raises(CommandError) as by_change:
        sprio.read(text)
    assert str(by_change.value) == str(whole.value)


def _outcome(read: object, text: str) -> object:
    try:
        return read(text)  # type: ignore[operator]
    except CommandError as exc:
        return str(exc)


@given(first=sprio_tables(), then=sprio_tables(), plain=st.lists(st.integers(0, 10**20 - 1), min_size=9, max_size=9))
@FUZZ
def test_any_table_after_any_table_reads_as_the_whole_read(first: str, then: str, plain: list[int]) -> None:
    line = "|".join(map(str, plain))  # a plain line kept from one read to the next
    sprio = SprioLines()
    sprio.read(line)
    _outcome(sprio.read, f"{line}\n{first}")
    expected = _outcome(_own, f"{then}\n{line}")
    assert _outcome(sprio.read, f"{then}\n{line}") == expected


RECORDED = Path(__file__).parent / "data" / "fixtures" / "slurm" / "sprio-22.05.txt"
"""`sprio -h -o '%i|%Y|%S|%P|%J|%N|%Q|%A|%F'` on the 22.05 dev cluster: a job holding every node,
six pending ones of two users (vjrun's job 3 with `SiteFactor=5000`, job 5 with `--nice=50`)."""


def test_the_dev_clusters_sprio_read_by_change() -> None:
    text = RECORDED.read_text()
    sprio = SprioLines()
    own = sprio.read(text)
    assert own == _own(text) and own["3"] == 11_000 and own["5"] == 10_950 and sprio.new_lines == 6
    lines = text.splitlines()
    lines[0] = "2|13000|2000|1000|0|0|0|0|10000"  # vjob sent job 2 a site factor
    del lines[5]  # job 7 started
    moved = "\n".join(lines) + "\n"
    assert sprio.read(moved) == _own(moved) and sprio.new_lines == 1 and "7" not in sprio.read(moved)
    fields = [line.split("|") for line in lines]  # a recalculation: every job a minute older
    aged = "".join(f"{f[0]}|{int(f[1]) + 60}|{'|'.join(f[2:7])}|60|{f[8]}\n" for f in fields)
    assert sprio.read(aged) == _own(aged) and sprio.new_lines == 5 and sprio.read(aged)["3"] == 11_060


def test_plain_lines_of_every_width_read_in_arrays_as_the_whole_read() -> None:
    """Seeded: at a recalculation every line is new and plain, read in arrays (int64) when the
    priority and the site factor have at most 18 digits, by int() when one has 19 or 20; a
    leading zero, a 0 and the widest values give what the whole read gives, by either way."""
    rnd = random.Random(4137)

    def number() -> str:
        width = rnd.choice((1, 1, 2, 9, 17, 18, 18, 19, 20))
        return rnd.choice("0123456789") + "".join(rnd.choice("0123456789") for _ in range(width - 1))

    for wide in (False, True):
        sprio = SprioLines()
        for _ in range(4):
            lines = []
            for job in range(1000, 1300):
                prio, site = number(), number()
                if not wide:
                    prio, site = prio[:18], site[:18]
                lines.append("|".join([str(job), prio, site, "500", "0", "0", "0", number(), "7"]))
            text = "\n".join(lines) + "\n"
            assert sprio.read(text) == _own(text)
            assert sprio.new_lines == len(lines)
