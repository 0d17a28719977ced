"""`--subclusters FILE`: the paper's farm loads; bad files are errors naming entry and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.subclusters import load_farm
from vjob.errors import InputError

PAPER = Path(__file__).resolve().parents[1] / "docs" / "remap" / "arrive-f.toml"

GOOD = """
[[subcluster]]
name = "fast"
nodes = 2
cores_per_node = 4
memory_mb_per_node = 4096
freq_ghz = 3.0
[[subcluster]]
name = "slow"
nodes = 1
cores_per_node = 2
memory_mb_per_node = 1024
freq_ghz = 2.0
[[kind]]
name = "EP"
memory_mb_per_core = 600
time = { fast = 1.0, slow = 1.5 }
"""


def test_paper_farm_loads_in_speed_order() -> None:
    farm = load_farm(PAPER)
    assert [s.name for s in farm.subclusters] == ["B", "C", "A", "D"]
    assert [s.slots for s in farm.subclusters] == [8, 8, 8, 8]
    assert {k.name for k in farm.kinds} == {"CG", "FT", "LU", "HPL", "MG", "EP", "IS"}
    ft = next(k for k in farm.kinds if k.name == "FT")
    d = farm.by_name["D"]
    assert farm.runtime_factor(ft, d) == pytest.approx(1.32 * 2.8)  # FT thrashes on D (1.2 GB)
    assert farm.runtime_factor(ft, farm.by_name["A"]) == pytest.approx(1.20)


def test_rank_defaults_to_clock_and_memory_decides_thrashing(tmp_path: Path) -> None:
    p = tmp_path / "farm.toml"
    p.write_text(GOOD)
    farm = load_farm(p)
    assert [s.name for s in farm.subclusters] == ["fast", "slow"]
    ep = farm.kinds[0]
    assert farm.runtime_factor(ep, farm.by_name["slow"]) == pytest.approx(1.5 * 2.8)  # 600 > 512 MB/core
    assert farm.scaled(3).by_name["fast"].nodes == 6


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("freq_ghz = 3.0", "freq_ghz = -3.0"), r"subcluster\[0\]\.freq_ghz = -3\.0: must be > 0"),
        (lambda t: t.replace("nodes = 1\n", "nodes = 0\n"), r"subcluster\[1\]\.nodes = 0: must be >= 1"),
        (lambda t: t.replace("nodes = 1\n", 'nodes = "1"\n'), r"subcluster\[1\]\.nodes = '1': must be an integer"),
        (lambda t: t.replace("slow = 1.5", "slower = 1.5"), r"kind\[0\]\.time: no entry for sub-cluster 'slow'"),
        (lambda t: t.replace("fast = 1.0, ", "fast = 1.0, mid = 2.0, "), r"kind\[0\]\.time\.mid: no such sub-cluster"),
        (lambda t: t.replace('name = "slow"', 'name = "fast"'), r"subcluster\[1\]\.name = 'fast': duplicate"),
        (lambda t: t.replace('name = "slow"', 'name = "a b"'), r"subcluster\[1\]\.name = 'a b'"),
        (lambda t: "colour = 1\n" + t, r"colour: unknown top-level key"),
        (lambda t: t.replace("time =", "tyme ="), r"kind\[0\]: missing key 'time'"),
        (lambda t: t.replace("time = {", "accuracy = 1.5\ntime = {"), r"kind\[0\]\.accuracy = 1\.5: must be <= 1"),
        (lambda t: t.replace("[[kind]]", "[[kind\n"), r"not valid TOML"),
    ],
)
def test_bad_file_names_field_and_value(tmp_path: Path, edit: object, message: str) -> None:
    p = tmp_path / "farm.toml"
    p.write_text(edit(GOOD))  # type: ignore[operator]
    with pytest.raises(InputError, match=message):
        load_farm(p)


def test_missing_and_oversized_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        load_farm(tmp_path / "nope.toml")
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (2 << 20))
    with pytest.raises(InputError, match="larger than"):
        load_farm(big)
    cycles = tmp_path / "cycles.toml"
    cycles.write_text(GOOD.replace("freq_ghz = 3.0\n", "freq_ghz = 3.0\ncycles = { ins = 0.5 }\n"))
    with pytest.raises(InputError, match=r"subcluster\[1\]\.cycles: no entry for event 'ins'"):
        load_farm(cycles)


def test_slurm_nodes_carry_weight_and_features_that_name_their_subcluster() -> None:
    from plugins.slurm.parse_json import nodes as json_nodes
    from plugins.slurm.parse_text import nodes_from_scontrol
    from preemption.remap.models import subcluster_of

    text = (
        "NodeName=n1 Arch=x86_64 CoresPerSocket=4 CPUAlloc=0 CPUTot=4 AvailableFeatures=B,gpu "
        "ActiveFeatures=B,gpu RealMemory=4096 State=IDLE Weight=5\n\n"
        "NodeName=n2 CPUTot=2 AvailableFeatures=D ActiveFeatures=D RealMemory=1228 State=IDLE Weight=40\n"
    )
    n1, n2 = nodes_from_scontrol(text, source="scontrol")
    assert (n1.weight, n2.weight) == (5, 40)
    names = [s.name for s in load_farm(PAPER).subclusters]
    assert subcluster_of(n1.features, names) == "B" and subcluster_of(n2.features, names) == "D"
    assert subcluster_of(("gpu",), names) is None
    with pytest.raises(InputError, match="Weight='heavy': expected a whole number"):
        nodes_from_scontrol(text.replace("Weight=5", "Weight=heavy"), source="scontrol")
    fixture = Path(__file__).parent / "data" / "fixtures" / "slurm" / "rivos_sinfo_out.json"
    doc = json.loads(fixture.read_text())
    doc["nodes"][0]["weight"] = 7
    assert json_nodes(doc, source="sinfo")[0].weight == 7
    doc["nodes"][0]["weight"] = "x"
    with pytest.raises(InputError, match=r"weight = 'x': expected int"):
        json_nodes(doc, source="sinfo")


def test_the_papers_other_experiments_load() -> None:
    no_ft = load_farm(PAPER.with_name("arrive-f-no-ft.toml"))
    assert {k.name: k.weight for k in no_ft.kinds}["FT"] == 0
    no_c = load_farm(PAPER.with_name("arrive-f-no-c.toml"))
    assert [s.name for s in no_c.subclusters] == ["B", "A", "D"]
