"""Workload readers: every shared trace reads, malformed input names file, line and field."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import numpy as np
import pytest

from simulator.swf import read_swf, summarise, write_swf
from simulator.torque_accounting import duration_s, memory_mb, read_torque_accounting
from vjob.errors import InputError

LINE = "{id} {submit} -1 {run} {procs} -1 -1 {procs} {req} -1 {status} 3 1 -1 2 -1 -1 -1\n"


@pytest.fixture(scope="module")
def traces(shared_dir: Path) -> Path:
    return shared_dir / "data" / "traces"


@pytest.fixture(scope="module")
def shared_traces(traces: Path) -> dict[str, object]:
    """Each shared trace read once for the whole module (the big ones take a second)."""
    return {
        "lublin": read_swf(traces / "lublin_256.swf"),
        "nasa": read_swf(traces / "NASA-iPSC-1993-3.1-cln.swf.gz"),
        "wagap": read_swf(traces / "wagap-2013.swf", lenient=True),
        "torque": read_torque_accounting(traces / "torque_accounting_kuleuven_2016-06.tar.gz"),
    }


def test_every_file_in_the_traces_directory_is_covered(traces: Path):
    names = {p.name for p in traces.iterdir()}
    read_here = {
        "lublin_256.swf",
        "NASA-iPSC-1993-3.1-cln.swf.gz",
        "wagap-2013.swf",
        "torque_accounting_kuleuven_2016-06.tar.gz",
        "wagap-2013.swf.machines",  # machine description beside wagap, not a trace
    }
    assert names <= read_here, f"new trace files to read in this test: {names - read_here}"


def test_lublin_reference_trace(shared_traces):
    w = shared_traces["lublin"]
    assert len(w) == 10_000 and w.header["MaxNodes"] == "256"
    assert w.nodes.max() == 256 and w.submit[0] == 5094
    assert (w.walltime == w.runtime).all()  # no estimates in the trace: perfect ones


def test_nasa_gzip_trace_counts_the_jobs_that_never_ran(shared_traces):
    w = shared_traces["nasa"]
    # 18,239 records (README); 173 have no runtime or no processors.
    assert len(w) + w.skipped["not_run"] == 18_239
    assert w.header["MaxNodes"] == "128" and w.header["Queue"].startswith("0")
    assert np.all(np.diff(w.submit) >= 0)


def test_wagap_extended_columns_and_its_two_bad_lines(shared_traces, traces: Path):
    w = shared_traces["wagap"]
    assert len(w) + w.skipped["malformed"] == 17_900
    assert w.skipped["malformed"] == 2
    assert w.properties is not None
    assert w.properties[0] == "q_1d 1:ppn=64:x86_64:cl_zewura#excl"
    with pytest.raises(InputError, match=r"wagap-2013\.swf:4186: field 4 \(run_time\) = '-1359980917'"):
        read_swf(traces / "wagap-2013.swf")


def test_torque_accounting_archive(shared_traces):
    w = shared_traces["torque"]
    # 11,157 E records: 9,257 jobs that ran, the rest ended before they started.
    assert len(w) + w.skipped["not_run"] == 11_157
    assert w.header["RecordsE"] == "11157"
    assert w.submit.min() == 0 and (w.runtime > 0).all()
    assert w.properties[0].startswith("q")


def test_summary_reports_offered_load(shared_traces):
    info = summarise(shared_traces["lublin"])
    assert info["jobs"] == 10_000 and info["machine_nodes"] == 256
    work = float(np.sum(shared_traces["lublin"].runtime * shared_traces["lublin"].nodes))
    assert info["offered_load"] == pytest.approx(work / (256 * info["span_s"]))


def _write(tmp_path: Path, text: str, name: str = "t.swf") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_header_minus_one_status_and_gzip_by_content(tmp_path: Path):
    text = "; MaxNodes: 64\n; Note: a comment: with a colon\n"
    text += LINE.format(id=1, submit=0, run=100, procs=4, req=200, status=1)
    text += "2 5 -1 50 -1 -1 -1 8 -1 -1 0 3 1 -1 2 -1 -1 -1\n"  # allocated unknown, requested 8
    text += LINE.format(id=3, submit=7, run=30, procs=2, req=-1, status=2)  # partial record
    text += LINE.format(id=4, submit=9, run=-1, procs=2, req=-1, status=5)  # cancelled, never ran
    plain = _write(tmp_path, text)
    packed = tmp_path / "t.data"  # gzip with no .gz in the name
    packed.write_bytes(gzip.compress(text.encode()))
    for path in (plain, packed):
        w = read_swf(path)
        assert w.job_id.tolist() == [1, 2]
        assert w.nodes.tolist() == [4, 8]
        assert w.header == {"MaxNodes": "64", "Note": "a comment: with a colon"}
        assert w.walltime.tolist() == [200, 50]  # -1 estimate → the runtime
        assert w.skipped == {"malformed": 0, "partial": 1, "not_run": 1}
        assert w.status.tolist() == [1, 0]


def test_requested_processors_used_when_allocated_is_unknown(tmp_path: Path):
    line = "1 0 -1 10 -1 -1 -1 16 -1 -1 1 1 1 -1 1 -1 -1 -1\n"
    assert read_swf(_write(tmp_path, line)).nodes.tolist() == [16]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1 0 -1 10 4\n", r"t\.swf:2: 5 fields, an SWF line needs 18"),
        ("1 0 -1 ten 4 -1 -1 4 -1 -1 1 1 1 -1 1 -1 -1 -1\n", r"t\.swf:2: field 4 \(run_time\) = 'ten': not a number"),
        ("1 0 -1 10 -4 -1 -1 4 -1 -1 1 1 1 -1 1 -1 -1 -1\n", r"field 5 \(allocated_processors\) = '-4'"),
        ("1 -1 -1 10 4 -1 -1 4 -1 -1 1 1 1 -1 1 -1 -1 -1\n", r"field 2 \(submit_time\) = '-1': a job needs"),
    ],
)
def test_malformed_line_names_file_line_and_field(tmp_path: Path, line: str, message: str):
    good = LINE.format(id=1, submit=0, run=100, procs=4, req=200, status=1)
    path = _write(tmp_path, good + line)
    with pytest.raises(InputError, match=message):
        read_swf(path)
    lenient = read_swf(path, lenient=True)
    assert len(lenient) == 1 and lenient.skipped["malformed"] == 1


def test_missing_and_binary_files_are_input_errors(tmp_path: Path):
    with pytest.raises(InputError, match="cannot open the trace"):
        read_swf(tmp_path / "absent.swf")
    binary = tmp_path / "b.swf"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InputError, match=r"b\.swf:1: not text"):
        read_swf(binary)


def test_write_then_read_round_trip(shared_traces, tmp_path: Path):
    w = shared_traces["nasa"].take(slice(0, 500))
    buf = io.StringIO()
    write_swf(w, buf)
    back = read_swf(_write(tmp_path, buf.getvalue()))
    for name in ("job_id", "submit", "runtime", "nodes", "walltime", "user", "status"):
        assert getattr(back, name).tolist() == getattr(w, name).tolist(), name


ACCOUNTING = """\
06/02/2016 00:03:28;Q;7.head;queue=qdef
06/02/2016 00:04:32;S;7.head;user=u1 queue=q72h qtime=1464818608 start=1464818672
06/02/2016 01:04:32;E;7.head;user=u1 group=g queue=q72h qtime=1464818608 start=1464818672 end=1464822272 \
Resource_List.nodect=2 unique_node_count=2 Resource_List.walltime=02:00:00 Resource_List.mem=8gb Exit_status=0 \
Resource_List.nodes=2:ppn=4
06/02/2016 01:05:00;E;8.head;user=u2 queue=qdef qtime=1464818700 start=0 end=1464822300 Exit_status=271
06/02/2016 01:06:00;D;9.head;requestor=u2@login
"""


def test_torque_records_give_jobs_from_end_records(tmp_path: Path):
    path = _write(tmp_path, ACCOUNTING, "20160602")
    w = read_torque_accounting(path)
    assert len(w) == 1 and w.skipped["not_run"] == 1
    assert w.submit.tolist() == [0] and w.runtime.tolist() == [3600]
    assert w.nodes.tolist() == [2] and w.walltime.tolist() == [7200]
    assert w.memory_mb.tolist() == [4096]  # 8 GB over 2 nodes
    assert w.header["RecordsQ"] == "1" and w.header["RecordsD"] == "1"
    # a directory of daily files reads the same
    assert len(read_torque_accounting(tmp_path)) == 1


def test_torque_malformed_record_names_line_and_field(tmp_path: Path):
    bad = ACCOUNTING.replace("06/02/2016 01:05:00;E", "2016-06-02 01:05:00;E")
    path = _write(tmp_path, bad, "20160602")
    with pytest.raises(InputError, match=r"20160602:4: field date = '2016-06-02 01:05:00'"):
        read_torque_accounting(path)
    assert read_torque_accounting(path, lenient=True).skipped["malformed"] == 1
    bad = ACCOUNTING.replace("Resource_List.walltime=02:00:00", "Resource_List.walltime=2h")
    with pytest.raises(InputError, match=r":3: field Resource_List.walltime = '2h'"):
        read_torque_accounting(_write(tmp_path, bad, "x"))


def test_torque_durations_and_sizes():
    assert duration_s("167:00:00", "w", "here") == 167 * 3600
    assert duration_s("05:30", "w", "here") == 330
    assert duration_s("42", "w", "here") == 42
    assert memory_mb("2500mb", "m", "here") == 2500
    assert memory_mb("37014168kb", "m", "here") == 36147
    assert memory_mb("4gb", "m", "here") == 4096
