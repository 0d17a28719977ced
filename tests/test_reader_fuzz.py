"""Trace and configuration readers answer bad input with an InputError/ConfigError naming the
file (and line and field where there is one), never a traceback (issue 23, item 13).

Targeted cases first (each reproduced a crash), then hypothesis mutating small slices of the
real traces in tests/data: derandomized, 1,500 cases per reader, a few seconds each.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.swf import SKIPPED_HEADER, read_swf
from simulator.torque_accounting import read_torque_accounting
from vjob import config as vconfig
from vjob.errors import ConfigError, InputError

TRACES = Path(__file__).parent / "data" / "traces"
FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
GOOD = "1 0 -1 100 4 -1 -1 4 200 -1 1 3 1 -1 2 -1 -1 -1\n"


def _swf_slice() -> bytes:
    lines = (TRACES / "lublin_256.swf").read_bytes().splitlines(keepends=True)
    header = [ln for ln in lines[:40] if ln.startswith(b";")][:6]
    return b"".join(header + [ln for ln in lines if not ln.startswith(b";")][:20])


def _torque_slice() -> bytes:
    with tarfile.open(TRACES / "torque_accounting_kuleuven_2016-06.tar.gz") as tar:
        member = next(m for m in sorted(tar.getmembers(), key=lambda m: m.name) if m.isfile())
        data = tar.extractfile(member).read()  # type: ignore[union-attr]
    lines = data.splitlines(keepends=True)
    ends = [ln for ln in lines if b";E;" in ln][:6]
    return b"".join([ln for ln in lines if b";E;" not in ln][:4] + ends)


SWF = _swf_slice()
TORQUE = _torque_slice()


# -- SWF: targeted --------------------------------------------------------------------------
def test_corrupt_gzip_is_an_input_error_even_when_lenient(tmp_path: Path) -> None:
    packed = gzip.compress(SWF * 50)
    cases = {
        "flipped": packed[:200] + bytes(b ^ 0x55 for b in packed[200:400]) + packed[400:],  # zlib.error
        "truncated": packed[: len(packed) // 2],  # EOFError
        "bad_header": b"\x1f\x8b\x09" + packed[3:],  # BadGzipFile
    }
    for name, data in cases.items():
        path = tmp_path / f"{name}.swf.gz"
        path.write_bytes(data)
        for lenient in (False, True):
            with pytest.raises(InputError, match=rf"{name}\.swf\.gz:\d+: cannot read the trace"):
                read_swf(path, lenient=lenient)


@pytest.mark.parametrize(
    ("field", "token"),
    [("run_time", "inf"), ("run_time", "nan"), ("run_time", "1e400"), ("status", "9" * 5000), ("user_id", "-inf")],
)
def test_non_finite_and_huge_numbers_name_the_field(tmp_path: Path, field: str, token: str) -> None:
    fields = GOOD.split()
    fields[{"run_time": 3, "status": 10, "user_id": 11}[field]] = token
    path = tmp_path / "t.swf"
    path.write_text(GOOD + " ".join(fields) + "\n")
    with pytest.raises(InputError, match=rf"t\.swf:2: field \d+ \({field}\)"):
        read_swf(path)
    w = read_swf(path, lenient=True)
    assert len(w) == 1 and w.skipped["malformed"] == 1
    assert w.header[SKIPPED_HEADER].startswith(f"1 line(s), the first: {path}:2: field")


def test_lenient_skips_a_non_utf8_line_and_reports_the_first(tmp_path: Path) -> None:
    path = tmp_path / "t.swf"
    path.write_bytes(GOOD.encode() + b"2 5 -1 \xff\xfe 4 -1\n" + GOOD.encode() + b"x" * 70_000 + b"\n")
    with pytest.raises(InputError, match=r"t\.swf:2: not text"):
        read_swf(path)
    w = read_swf(path, lenient=True)
    assert len(w) == 2 and w.skipped["malformed"] == 2
    assert "t.swf:2: not text" in w.header[SKIPPED_HEADER] and w.header[SKIPPED_HEADER].startswith("2 line(s)")


# -- Torque accounting: targeted -------------------------------------------------------------
def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_damaged_accounting_archive_is_an_input_error(tmp_path: Path) -> None:
    good = _tar(tmp_path / "a.tar.gz", {"20160601": TORQUE * 200, "20160602": TORQUE * 200})
    data = good.read_bytes()
    for name, broken in {
        "flipped": data[:300] + bytes(b ^ 0x55 for b in data[300:600]) + data[600:],
        "truncated": data[: len(data) // 2],
    }.items():
        path = tmp_path / f"{name}.tar.gz"
        path.write_bytes(broken)
        for lenient in (False, True):
            with pytest.raises(InputError, match=rf"{name}\.tar\.gz: not a readable tar archive"):
                read_torque_accounting(path, lenient=lenient)


@pytest.mark.parametrize(
    ("attr", "value"),
    [
        ("end", "9" * 5000),
        ("start", "1e9"),
        ("Resource_List.walltime", "9" * 5000 + ":00"),
        ("Resource_List.mem", "9" * 5000 + "kb"),
    ],
)
def test_huge_accounting_values_name_the_field(tmp_path: Path, attr: str, value: str) -> None:
    line = (
        "06/02/2016 01:04:32;E;7.head;user=u1 queue=q qtime=1464818608 start=1464818672 end=1464822272 "
        "Resource_List.walltime=02:00:00 Resource_List.mem=8gb"
    )
    fields = dict(kv.split("=", 1) for kv in line.split(";")[3].split())
    fields[attr] = value
    path = tmp_path / "20160602"
    path.write_text(";".join(line.split(";")[:3]) + ";" + " ".join(f"{k}={v}" for k, v in fields.items()) + "\n")
    with pytest.raises(InputError, match=rf"20160602:1: field {attr} = "):
        read_torque_accounting(path)
    assert read_torque_accounting(path, lenient=True).skipped["malformed"] == 1


# -- TOML configuration: targeted ------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b"[database]\nurl = 'x'\nconnect_timeout_s = " + b"9" * 5000,
            r"c\.toml:3: .*'connect_timeout_s': a number of 5000 digits",
        ),
        (b"[agent]\n\ninterval_s = \xff\n", r"c\.toml:3: not valid TOML: byte 0xff is not UTF-8"),
        (b"x = " + b"[" * 5000 + b"]" * 5000, r"c\.toml: not valid TOML: .*nested too deeply"),
        (b"x = " + b"{a=" * 3000 + b"1" + b"}" * 3000, r"c\.toml: not valid TOML: .*nested too deeply"),
        (b"[agent]\ninterval_s = \n", r"c\.toml: not valid TOML: .*line 2"),
    ],
)
def test_toml_that_crashed_the_loader(tmp_path: Path, body: bytes, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_bytes(body)
    with pytest.raises(ConfigError, match=message):
        vconfig.load(path)


def test_huge_configuration_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_bytes(b"# padding\n" * 200_000)
    with pytest.raises(ConfigError, match="larger than"):
        vconfig.load(path)


# -- hypothesis: mutated slices of the real traces -------------------------------------------
def _mutate(data: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    out = bytearray(data)
    for pos, cut, insert in edits:
        at = pos % (len(out) + 1)
        out[at : at + cut] = insert
    return bytes(out)


EDITS = st.lists(
    st.tuples(
        st.integers(0, 1 << 20),
        st.integers(0, 8),
        st.one_of(
            st.binary(max_size=6),
            st.sampled_from(
                [b"-1", b"nan", b"inf", b"1e400", b"9" * 400, b"\n", b";", b"=", b":", b"\xff", b"\x00", b" "]
            ),
        ),
    ),
    min_size=1,
    max_size=6,
)


@FUZZ
@given(edits=EDITS, packed=st.booleans(), lenient=st.booleans())
def test_fuzz_swf(
    tmp_path_factory: pytest.TempPathFactory, edits: list[tuple[int, int, bytes]], packed: bool, lenient: bool
) -> None:
    data = _mutate(SWF, edits)
    if packed:  # mutate the compressed bytes too: a damaged stream
        data = _mutate(gzip.compress(data), edits[:1])
    path = tmp_path_factory.mktemp("swf") / "t.swf"
    path.write_bytes(data)
    try:
        w = read_swf(path, lenient=lenient)
    except InputError as exc:
        assert str(path) in str(exc)
        return
    if w.skipped["malformed"]:
        assert lenient and SKIPPED_HEADER in w.header


@FUZZ
@given(edits=EDITS, archive=st.booleans(), lenient=st.booleans())
def test_fuzz_torque_accounting(
    tmp_path_factory: pytest.TempPathFactory, edits: list[tuple[int, int, bytes]], archive: bool, lenient: bool
) -> None:
    base = tmp_path_factory.mktemp("acct")
    data = _mutate(TORQUE, edits)
    if archive:
        path = _tar(base / "a.tar.gz", {"20160601": data})
        path.write_bytes(_mutate(path.read_bytes(), edits[:1]))
    else:
        path = base / "20160601"
        path.write_bytes(data)
    try:
        read_torque_accounting(path, lenient=lenient)
    except InputError as exc:
        assert str(path) in str(exc)


CONFIG = (
    b'[database]\nurl = "postgresql://vjob:pw@db/vjob"\nconnect_timeout_s = 5\n'
    b"[agent]\ninterval_s = 10.0\nrms = 'slurm'\n[priority]\ntargets = {alice = 0.5}\n"
    b"[[saline.sites]]\nname = 'a'\n"
)


@FUZZ
@given(edits=EDITS)
def test_fuzz_toml_configuration(tmp_path_factory: pytest.TempPathFactory, edits: list[tuple[int, int, bytes]]) -> None:
    path = tmp_path_factory.mktemp("cfg") / "c.toml"
    path.write_bytes(_mutate(CONFIG, edits))
    try:
        vconfig.load(path)
    except ConfigError as exc:
        assert str(path) in str(exc)
