"""The one PBS duration/size reader (issue 22 item 9) and the name validators (issue 23, Low:
`^...$` with re.match accepted a trailing newline). Pure functions: no PBS needed."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from plugins.pbs import adapter, names, submit_filter, units
from vjob.errors import InputError

HOOK_SOURCE = (Path(__file__).resolve().parents[1] / "plugins" / "pbs" / "openpbs_hook.py").read_text()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("3600", 3600),  # seconds (accounting logs, -l walltime=3600)
        ("90.5", 90.5),  # with a fraction
        ("1:30", 90),  # MM:SS
        ("23:59:00", 86340),  # HH:MM:SS
        ("335:34:49", 335 * 3600 + 34 * 60 + 49),  # hours past 24 (qstat)
        ("1:00:00:00", 86400),  # D:HH:MM:SS (Moab, Torque -l walltime)
        ("2:03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),
        (" 01:00:00 ", 3600),
        ("00:00:00", 0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert units.duration_s(text, where="walltime") == seconds


@pytest.mark.parametrize(
    "text",
    ["", ":", "1:", ":30", "1:2:3:4:5", "-1", "1e3", "nan", "inf", "1.5:00", "1:xx", "01:00:00\n1", "²", "٣", "9" * 40],
)
def test_bad_durations_name_the_field(text: str) -> None:
    with pytest.raises(InputError, match=r"^walltime = .*: not a duration"):
        units.duration_s(text, where="walltime")


def test_a_duration_longer_than_a_century_is_garbage() -> None:
    with pytest.raises(InputError, match="longer than a century"):
        units.duration_s("999999999:00:00", where="walltime")


@pytest.mark.parametrize(
    ("text", "megabytes"),
    [
        ("1048576", 1),  # bare number = bytes
        ("1024kb", 1),
        ("17592kb", 17),
        ("512mb", 512),
        ("512MB", 512),
        ("4gb", 4096),
        ("1G", 1024),  # multiplier without b
        ("1tb", 1024 * 1024),
        ("1pb", 1024**3),
        ("131072kw", 1024),  # words: 8 bytes
        ("2w", 0),
        ("64 gb", 64 * 1024),
    ],
)
def test_sizes(text: str, megabytes: int) -> None:
    assert units.size_mb(text, where="mem") == megabytes


def test_moab_sizes_default_to_megabytes() -> None:
    assert units.size_mb("64000", where="MEM", bare="m") == 64000
    assert units.size_mb("64G", where="MEM", bare="m") == 64 * 1024


@pytest.mark.parametrize("text", ["", "gb", "4xb", "-4gb", "4gb\n", "4.5gb", "1e9", "4 g b", "9" * 40, "1eb"])
def test_bad_sizes_name_the_field(text: str) -> None:
    with pytest.raises(InputError, match=r"^mem = .*: not a size"):
        units.size_mb(text, where="mem")


# -- names --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "good"),
    [
        (names.job_id, ["123", "123.server.domain", "673175[]", "673175[19].fruster.stanford.edu"]),
        (names.user, ["vsc30001", "ann", "svc_batch", "m.dupont", "host1$"]),
        (names.queue, ["workq", "interactive", "q_long-2"]),
        (names.node, ["r7i3n1", "node07.cluster", "n1", "cn_vnode[0]".split("[")[0]]),
    ],
)
def test_good_names(check: object, good: list[str]) -> None:
    for value in good:
        assert check(value) == value  # type: ignore[operator]


@pytest.mark.parametrize("check", [names.job_id, names.user, names.queue, names.node])
@pytest.mark.parametrize("bad", ["n1\n", "12\n", "", "-rf", "a b", "a;b", "$(reboot)", "a\x00", "é", "x" * 300])
def test_bad_names_are_refused_with_the_field(check: object, bad: str) -> None:
    """A trailing newline is refused: every validator is a fullmatch."""
    with pytest.raises(InputError, match=r" = .*: not a"):
        check(bad, field="the field")  # type: ignore[operator]


def test_the_adapter_refuses_a_job_id_with_a_trailing_newline() -> None:
    with pytest.raises(InputError, match="not a PBS job id"):
        adapter.check_job_id("12.server\n")


def test_the_standalone_copies_match() -> None:
    """The submit filter and the hook run without vjob installed and keep their own patterns:
    they must stay those of plugins.pbs.names, and be used with fullmatch."""
    hook_job_id = re.search(r'^JOB_ID = re.compile\(r"(.*)"\)$', HOOK_SOURCE, re.MULTILINE)
    hook_name = re.search(r'^NAME = re.compile\(r"(.*)"\)$', HOOK_SOURCE, re.MULTILINE)
    assert hook_job_id and hook_job_id.group(1) == names.JOB_ID.pattern
    assert hook_name and hook_name.group(1) == names.OS_IMAGE.pattern == submit_filter.NAME.pattern
    assert ".match(" not in HOOK_SOURCE and ".match(" not in Path(submit_filter.__file__).read_text()
    for path in Path(units.__file__).parent.glob("*.py"):
        assert not re.search(r"\.match\(r?\"\^", path.read_text()), f"{path.name}: ^...$ with re.match"
    assert importlib.util.find_spec("plugins.pbs.names") is not None
