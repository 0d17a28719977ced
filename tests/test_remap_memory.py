"""A remapped VM's memory follows its node kind: the domain's ceiling, the balloon target after a
move (pure), and the act through the provisioning driver on libvirt's test driver."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.remap_step import RemapState, set_memory
from pilot.specs import memory_ceiling
from preemption.remap.live import Move, Placement
from preemption.remap.memory import MemoryTarget, balloon_target_mib, domain_max_mib, targets_after
from preemption.remap.models import SubCluster
from provisioning.domain_xml import domain_xml
from provisioning.driver import Driver
from provisioning.vm_types import DriverError, VMSpec
from tests.services.libvirt import make_test_node
from vjob.config import parse
from vjob.errors import InputError

FARM = {
    "small": SubCluster("small", 2, 4, 1200, 2.0),
    "big": SubCluster("big", 2, 4, 4096, 3.0),
}
NODE_SC = {"s1": "small", "b1": "big"}
FARM_TOML = """
[[subcluster]]
name = "small"
nodes = 1
cores_per_node = 1
memory_mb_per_node = 1200
freq_ghz = 2.0
[[subcluster]]
name = "big"
nodes = 1
cores_per_node = 1
memory_mb_per_node = 4096
freq_ghz = 3.0
"""


@given(want=st.integers(1, 10**6), asked=st.integers(16, 10**5), extra=st.integers(0, 10**5))
def test_the_target_is_never_below_the_asked_nor_above_the_ceiling(want: int, asked: int, extra: int) -> None:
    ceiling = asked + extra
    t = balloon_target_mib(want, asked, ceiling)
    assert asked <= t <= ceiling
    assert t == want or want < asked or want > ceiling


def test_the_ceiling_is_the_largest_kind_within_4x_and_never_below_what_the_job_asked() -> None:
    assert domain_max_mib(1024, FARM) == 4096
    assert domain_max_mib(256, FARM) == 1024  # at most 4 × what it asked: a guest boots seeing all of it
    assert domain_max_mib(8192, FARM) == 8192
    assert domain_max_mib(256, {}) == 256


def test_after_a_swap_each_vm_wants_its_new_kind_and_home_brings_it_back_down() -> None:
    places = [Placement("7", (("vm7", "s1"),), ("s1",), 700), Placement("8", (("vm8", "b1"),), ("b1",), 2000)]
    swap = [Move("7", "vm7", "s1", "b1", "swap (thrashing)"), Move("8", "vm8", "b1", "s1", "swap (thrashing)")]
    assert targets_after(swap, places, NODE_SC, FARM) == [
        MemoryTarget("7", "vm7", "b1", "big", 4096, 700),
        MemoryTarget("8", "vm8", "s1", "small", 1200, 2000),
    ]
    # 8 asked 2000 MiB: on the small kind (1200 per slot) it keeps what it asked.
    assert balloon_target_mib(1200, 2000, 4096) == 2000
    home = [Move("7", "vm7", "b1", "s1", "home")]
    (t,) = targets_after(home, places, NODE_SC, FARM)
    assert (t.kind, t.want_mib) == ("small", 1200)
    (t,) = targets_after([Move("7", "vm7", "s1", "x9", "home")], places, NODE_SC, FARM)
    assert (t.kind, t.want_mib) == (None, 700)  # a node of no known kind: what it asked


def test_the_domain_boots_with_what_it_asked_under_its_ceiling(tmp_path: Path) -> None:
    for ceiling, want in ((0, "256"), (4096, "4096")):
        spec = VMSpec("vm1", tmp_path / "img", memory_mib=256, max_memory_mib=ceiling)
        root = ET.fromstring(domain_xml(spec, dom_type="qemu", overlay=tmp_path / "o", console_log=tmp_path / "c"))
        assert (root.findtext("memory"), root.findtext("currentMemory")) == (want, "256")
    with pytest.raises(InputError, match="max_memory_mib = 100: must be 0 or >= memory_mib"):
        VMSpec("vm1", tmp_path / "img", memory_mib=256, max_memory_mib=100)


def test_a_pilot_gets_the_farms_ceiling_only_with_remapping_on(tmp_path: Path) -> None:
    assert memory_ceiling(parse({}), 256) == 0
    (tmp_path / "farm.toml").write_text(FARM_TOML)
    assert memory_ceiling(parse({"remap": {"farm_file": str(tmp_path / "farm.toml")}}), 2048) == 4096
    # unreadable: a warning, the VM keeps what it asked
    assert memory_ceiling(parse({"remap": {"farm_file": str(tmp_path / "none.toml")}}), 256) == 0


@pytest.mark.libvirt
def test_the_step_sets_the_balloon_on_the_test_driver_bounded_and_logged(tmp_path: Path) -> None:
    """Our own domain XML (ceiling 2048, booted at 256) on a test-driver node: the step lets the
    balloon out to the big kind's memory up to the ceiling, then down to the small kind's, never
    below what was asked; libvirt refuses more than the ceiling, and a stopped VM is an error."""
    uri = make_test_node(tmp_path / "nodes", "b1")
    cfg = parse({"data_dir": str(tmp_path / "data"), "provisioning": {"nodes": {"b1": uri, "s1": uri}}})
    driver = Driver(cfg.provisioning, data_dir=tmp_path)
    spec = VMSpec("vm7", tmp_path / "img", memory_mib=256, max_memory_mib=2048)
    xml = domain_xml(spec, dom_type="test", overlay=tmp_path / "o", console_log=tmp_path / "c")
    driver.connection("b1").defineXML(xml).create()
    assert driver.memory("vm7", "b1") == (256, 2048)
    agent = Agent(cfg, object(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]
    state = RemapState(memory=driver)
    (rec,) = set_memory(agent.ports, state, [MemoryTarget("7", "vm7", "b1", "big", 4096, 256)])
    assert (rec["from_mib"], rec["mib"], rec["max_mib"]) == (256, 2048, 2048) and "error" not in rec
    assert driver.memory("vm7", "b1") == (2048, 2048)
    (rec,) = set_memory(agent.ports, state, [MemoryTarget("7", "vm7", "b1", "small", 1200, 256)])
    assert driver.memory("vm7", "b1") == (1200, 2048)
    (rec,) = set_memory(agent.ports, state, [MemoryTarget("7", "vm7", "b1", "tiny", 64, 256)])
    assert driver.memory("vm7", "b1") == (256, 2048)  # never below what the job asked
    with pytest.raises(DriverError, match=r"set memory of VM vm7 on node b1: 4096 MiB: must be 16\.\.2048"):
        driver.set_memory("vm7", "b1", 4096)
    # A VM gone from the node: logged with the job, no exception, the tick goes on.
    (rec,) = set_memory(agent.ports, state, [MemoryTarget("7", "ghost", "b1", "big", 4096, 256)])
    assert "no such domain" in rec["error"] and rec["job"] == "7"
    driver.connection("b1").lookupByName("vm7").destroy()
    with pytest.raises(DriverError, match="not running"):
        driver.set_memory("vm7", "b1", 512)
    driver.close()
