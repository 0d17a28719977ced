"""The Torque accounting reader (simulator.torque_accounting, shared with the simulator) on the
KU Leuven June 2016 logs, checked from the PBS side: record counts against an independent
count of the archive, and every recorded `-l nodes=` request read by the adapter's parser."""

from __future__ import annotations

import tarfile
from collections import Counter
from pathlib import Path

import pytest

from plugins.pbs import units
from plugins.pbs.convert import parse_nodes_spec
from simulator import torque_accounting
from simulator.torque_accounting import read_torque_accounting


@pytest.fixture(scope="module")
def archive(shared_dir: Path) -> Path:
    return shared_dir / "data" / "traces" / "torque_accounting_kuleuven_2016-06.tar.gz"


@pytest.fixture(scope="module")
def end_records(archive: Path) -> tuple[Counter[str], list[dict[str, str]]]:
    """Record types and the attributes of every E record, read with tarfile and str.split."""
    types: Counter[str] = Counter()
    ends = []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            for line in tar.extractfile(member).read().decode("utf-8", "replace").splitlines():  # type: ignore[union-attr]
                parts = line.split(";", 3)
                if len(parts) < 3:
                    continue
                types[parts[1]] += 1
                if parts[1] == "E":
                    ends.append(dict(kv.split("=", 1) for kv in parts[3].split() if "=" in kv))
    return types, ends


@pytest.mark.slow
def test_reader_counts_match_the_archive(archive: Path, end_records: tuple[Counter[str], list[dict[str, str]]]) -> None:
    types, ends = end_records
    workload = read_torque_accounting(archive)
    assert len(ends) == types["E"] == 11_157  # the figure the data README gives
    for kind, count in types.items():
        assert workload.header[f"Records{kind}"] == str(count)
    ran = [e for e in ends if int(e["start"]) > 0 and int(e["end"]) > int(e["start"])]
    assert len(workload) == len(ran) and workload.skipped["not_run"] == len(ends) - len(ran)
    assert workload.runtime.sum() == sum(int(e["end"]) - int(e["start"]) for e in ran)


def test_every_recorded_nodes_request_parses(end_records: tuple[Counter[str], list[dict[str, str]]]) -> None:
    """11,157 real Torque `-l nodes=` requests: the adapter's count agrees with Torque's nodect."""
    _types, ends = end_records
    checked = 0
    for attrs in ends:
        spec = attrs.get("Resource_List.nodes")
        if spec is None:
            continue
        parsed = parse_nodes_spec(spec, where="Resource_List.nodes")
        if "Resource_List.nodect" in attrs:
            assert parsed.nodes == int(attrs["Resource_List.nodect"]), spec
        assert parsed.cores >= parsed.nodes
        checked += 1
    assert checked > 10_000


def test_the_one_pbs_reader_agrees_with_the_accounting_reader(
    end_records: tuple[Counter[str], list[dict[str, str]]],
) -> None:
    """Issue 22 item 9: plugins.pbs.units is the one duration/size reader. On every recorded
    walltime and memory value of the archive it gives what simulator.torque_accounting's own
    copy gives (memory there is at least 1 MiB), so that copy can be replaced by it."""
    _types, ends = end_records
    compared = 0
    for attrs in ends:
        for key, value in attrs.items():
            if key.endswith("walltime") or key.endswith("cput"):
                assert units.duration_s(value, where=key) == torque_accounting.duration_s(value, key, "x")
            elif key.endswith("mem"):
                assert max(1, units.size_mb(value, where=key)) == torque_accounting.memory_mb(value, key, "x")
            else:
                continue
            compared += 1
    assert compared > 30_000
