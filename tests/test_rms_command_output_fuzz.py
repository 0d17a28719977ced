"""The small RMS-output parsers the recorded-output fuzzers (test_slurm_fuzz, test_pbs_fuzz,
test_oar_fuzz) do not reach, fuzzed (issue 39, "Tests that would have caught these").

`sprio`'s factor table, `sinfo --version`, `sbatch --parsable`, `qsub` and `oarsub` print a
line or a table the adapters read with a regular expression or `int(float(...))`. Whatever the
command prints, the adapter answers with a value of the documented shape or a CommandError
naming the command — never another exception (a tick would end on it) and never a job id that
is not one. The commands are replaced by their output only: the parsing is what is tested.

Seeded: derandomized under the "ci" profile (tests/conftest.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from plugins.oar.client import JOB_ID as OAR_JOB_ID
from plugins.oar.client import OarCommands, SubmitRequest
from plugins.pbs.adapter import PbsAdapter
from plugins.pbs.names import JOB_ID as PBS_JOB_ID
from plugins.slurm.adapter import SlurmAdapter
from vjob.errors import CommandError

FUZZ = settings(max_examples=500, suppress_health_check=list(HealthCheck))
"""Derandomized and deadline-free from the loaded profile ("ci" by default and under CI)."""

NUMBERS = st.one_of(
    st.integers(-(10**30), 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["inf", "-inf", "nan", "1e400", "9" * 5000, "", " ", "N/A", "٣", "0x10", "1_000"]),
    st.text(max_size=12),
)


@st.composite
def sprio_tables(draw: st.DrawFn) -> str:
    """sprio -h -o '%i|%Y|%S|%P|%J|%N|%Q|%A|%F' lines, with any field any text."""
    rows = []
    for _ in range(draw(st.integers(0, 4))):
        width = draw(st.sampled_from([9, 9, 9, 8, 10]))
        rows.append("|".join(draw(NUMBERS) for _ in range(width)))
    return "\n".join(rows)


class _Output:
    """A stand-in for an RMS client that prints `out` whatever it is asked."""

    conf = ""

    def __init__(self, out: str) -> None:
        self.out = out

    def run(self, *_args: Any, **_kw: Any) -> str:
        return self.out


@example(out="1|inf|0|0|0|0|0|0|0")
@example(out="1|1e400|0|0|0|0|0|0|0")
@example(out="1|nan|0|0|0|0|0|0|0")
@given(out=st.one_of(sprio_tables(), st.text(max_size=200)))
@FUZZ
def test_sprio_factors_are_whole_numbers_or_a_command_error(out: str) -> None:
    try:
        factors = SlurmAdapter(_Output(out)).priority_factors()  # type: ignore[arg-type]
    except CommandError as exc:
        assert "sprio" in str(exc) and "\n" not in str(exc).rstrip("\n")
        return
    for values in factors.values():
        assert len(values) == 8 and all(type(v) is int for v in values.values())


@given(out=st.one_of(st.text(max_size=80), st.from_regex(r"slurm [0-9]{1,6}\.[0-9]{1,6}\.[0-9]", fullmatch=True)))
@FUZZ
def test_slurm_version_is_two_small_numbers_or_a_command_error(out: str) -> None:
    try:
        major, minor = SlurmAdapter(_Output(out)).version()  # type: ignore[arg-type]
    except CommandError as exc:
        assert "sinfo" in str(exc)
        return
    assert 0 <= major < 1000 and 0 <= minor < 1000


JOB_LINES = st.one_of(
    st.text(max_size=60),
    st.from_regex(r"[0-9٣]{0,30}(;[a-z]{0,8})?\n?", fullmatch=True),
    st.from_regex(r"[0-9٣]{0,30}\.[a-z0-9.-]{0,20}\n?", fullmatch=True),
)


@given(out=JOB_LINES)
@FUZZ
def test_sbatch_answer_is_a_job_id_or_a_command_error(out: str) -> None:
    try:
        job_id = SlurmAdapter(_Output(out)).submit([], "#!/bin/sh\ntrue\n")  # type: ignore[arg-type]
    except CommandError:
        return
    assert re.fullmatch(r"[0-9]{1,10}", job_id)


class _Qsub(PbsAdapter):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.out = out

    def _run(self, args: Sequence[str], *, job: str | None = None) -> str:
        return self.out


@given(out=JOB_LINES)
@FUZZ
def test_qsub_answer_is_a_job_id_or_a_command_error(out: str) -> None:
    try:
        job_id = _Qsub(out).submit(__file__)
    except CommandError:
        return
    assert PBS_JOB_ID.fullmatch(job_id)


class _Oarsub(OarCommands):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.out = out

    def _run(self, args: list[str], *, user: str | None = None, job: str | None = None) -> str:
        return self.out


@example(out="OAR_JOB_ID=٣٣\n")  # Unicode digits: \d took them for a job id
@example(out="OAR_JOB_ID=" + "9" * 5000 + "\n")  # unbounded: a job id no other check accepts
@given(
    out=st.one_of(
        st.text(max_size=80),
        st.from_regex(r"\[ADMISSION RULE\] x\nOAR_JOB_ID=[0-9٣]{0,20}\n?", fullmatch=True),
    )
)
@FUZZ
def test_oarsub_answer_is_a_job_id_or_a_command_error(out: str) -> None:
    try:
        job_id = _Oarsub(out).submit(SubmitRequest(command=["true"]), user="root")
    except CommandError as exc:
        assert "oarsub" in str(exc)
        return
    assert OAR_JOB_ID.fullmatch(job_id)
