"""The memory model live: balloon statistics in the domain, swap-ins and swap-outs in the
profile, thrashing moved at once to a node kind with more memory; old saved states still restore."""

from __future__ import annotations

import math
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import libvirt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preemption.remap.live import Placement, decide_swaps, moves_for, running_jobs
from preemption.remap.models import Profile, SubCluster, thrashing
from preemption.remap.online import CYCLES, profile_from_window
from preemption.remap.policy import RemapParams, RunningJob, decide
from provisioning.domain_xml import BALLOON_STATS_PERIOD_S, domain_xml
from provisioning.driver import Driver, VMSpec
from provisioning.profiling import DomainSample, Profiler, window
from vjob.config import ProvisioningConfig
from vjob.errors import InputError

PARAMS = RemapParams(beta=20, tau_s=50, threshold_s=10, max_migrations=2, thrash_pages_s=1000)
FARM = {  # a node kind with small memory and a faster one with more: each node one VM
    "small": SubCluster("small", 2, 1, 512, 3.0, cycles={CYCLES: 1.0}),
    "big": SubCluster("big", 2, 1, 4096, 1.0, cycles={CYCLES: 1.0}),
}


# -- the memory model ----------------------------------------------------------------------
def test_thrashing_needs_swap_outs_as_well_when_they_are_measured() -> None:
    assert thrashing(Profile(50, swap_in_pages_s=5000, swap_out_pages_s=4000), 1000)
    assert not thrashing(Profile(50, swap_in_pages_s=5000, swap_out_pages_s=0), 1000)  # reading back
    assert not thrashing(Profile(50, swap_in_pages_s=10, swap_out_pages_s=9000), 1000)  # evicting once
    assert thrashing(Profile(50, swap_in_pages_s=5000), 1000)  # not measured: swap-ins alone


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_bad_swap_out_rate_names_the_field(bad: float) -> None:
    with pytest.raises(InputError, match="swap_out_pages_s"):
        Profile(50, swap_out_pages_s=bad)


def _sample(t: float, swap_in_kib: int, swap_out_kib: int | None, faults: int = 0) -> DomainSample:
    return DomainSample("vm", t, int(t * 1e9), 1, swap_in_kib, faults, swap_out_kib=swap_out_kib)


def test_window_gives_swap_in_and_out_rates_and_the_profile_carries_them() -> None:
    w = window(_sample(0, 0, 0), _sample(10, 400_000, 200_000, faults=90_000))
    assert w.swap_in_pages_s == pytest.approx(10_000) and w.swap_out_pages_s == pytest.approx(5_000)
    assert w.major_faults_s == pytest.approx(9_000)
    p = profile_from_window(w, freq_ghz=3.0)
    assert (p.swap_in_pages_s, p.swap_out_pages_s) == (w.swap_in_pages_s, w.swap_out_pages_s)
    assert thrashing(p, 1000)
    # a guest whose balloon reports no swap-outs (driver not loaded): unknown, not zero
    assert window(_sample(0, 0, None), _sample(10, 0, 5)).swap_out_pages_s is None


# -- the policy: at once, and only to more memory --------------------------------------------
def test_thrashing_job_goes_only_to_a_kind_with_more_memory() -> None:
    mem = {"A": 1024, "B": 1024, "D": 600}
    job = RunningJob("ft", "A", 1, memory_mb_per_slot=512, gains={"B": 50.0, "D": 50.0}, thrashing=True)
    # B has room and the same memory as A: moving there would only thrash again
    assert decide([job], {"A": 0, "B": 4, "D": 4}, mem, RemapParams()) == []
    out = decide([job], {"A": 0, "B": 0, "D": 0, "E": 1}, {**mem, "E": 2048}, RemapParams())
    assert [(d.kind, d.reason, d.dst) for d in out] == [("move", "thrashing", ("E",))]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("ABCD"), st.integers(1, 4), st.sampled_from((100, 400, 900)), st.booleans()),
        max_size=10,
    ),
    st.dictionaries(st.sampled_from("ABCD"), st.integers(0, 6)),
)
def test_every_thrashing_decision_lands_where_there_is_more_memory(
    spec: list[tuple[str, int, int, bool]], free: dict[str, int]
) -> None:
    mem = {"A": 1024, "B": 1024, "C": 2048, "D": 600}
    jobs = [
        RunningJob(f"j{i}", c, n, memory_mb_per_slot=m, gains={o: 1.0 for o in "ABCD" if o != c}, thrashing=t)
        for i, (c, n, m, t) in enumerate(spec)
    ]
    by_id = {j.id: j for j in jobs}
    for d in decide(jobs, {c: free.get(c, 0) for c in mem}, mem, RemapParams()):
        if d.reason == "thrashing":
            first = by_id[d.jobs[0]]
            assert first.thrashing and mem[d.dst[0]] > mem[first.cluster]
            assert mem[d.dst[0]] >= first.memory_mb_per_slot


def test_agent_pipeline_swaps_a_thrashing_vm_onto_the_big_node_at_once_despite_the_loss() -> None:
    """Samples → window → profile → the agent's swaps (no free slot): the thrashing VM on the
    small node changes places with an idle VM of equal size on the big (slower) node, though the
    CPU model alone says it loses there."""
    t0, t1 = 0.0, 50.0
    busy = (
        DomainSample("vm-t", t0, 0, 1, 0, 0, swap_out_kib=0),
        DomainSample("vm-t", t1, int(45e9), 1, 4 * 2000 * 50, 0, swap_out_kib=4 * 1800 * 50),
    )
    idle = (DomainSample("vm-i", t0, 0, 1, swap_out_kib=0), DomainSample("vm-i", t1, int(1e9), 1, swap_out_kib=0))
    profiles = {
        "t": profile_from_window(window(*busy), freq_ghz=FARM["small"].freq_ghz),
        "i": profile_from_window(window(*idle), freq_ghz=FARM["big"].freq_ghz),
    }
    places = [Placement("t", (("vm-t", "s1"),), ("s1",), 256), Placement("i", (("vm-i", "b1"),), ("b1",), 256)]
    node_sc = {"s1": "small", "b1": "big"}
    jobs = running_jobs(places, profiles, node_sc, FARM, PARAMS, 110.0)
    assert [j.thrashing for j in jobs] == [True, False]
    decisions = decide_swaps(jobs, FARM, PARAMS)
    assert [(d.kind, d.reason, d.jobs) for d in decisions] == [("swap", "thrashing", ("t", "i"))]
    assert decisions[0].gain_s < PARAMS.threshold_s  # taken at once, whatever the gain
    assert {(m.vm, m.dst) for m in moves_for(decisions, places)} == {("vm-t", "b1"), ("vm-i", "s1")}
    # once it stops swapping on the big node nothing pulls it back to the small one
    calm = Profile(50, counters={CYCLES: 45 * 1e9}, swap_in_pages_s=0, swap_out_pages_s=0)
    back = running_jobs(
        [Placement("t", (("vm-t", "b1"),), ("s1",), 256, migrations=1)], {"t": calm}, node_sc, FARM, PARAMS, 110.0
    )
    assert not back[0].thrashing


# -- the domain: a balloon with statistics; old saved states ----------------------------------
def test_domain_has_a_virtio_balloon_with_a_statistics_period(tmp_path: Path) -> None:
    spec = VMSpec("vm", tmp_path / "base.qcow2")
    for dom_type in ("kvm", "test"):
        root = ET.fromstring(domain_xml(spec, dom_type=dom_type, overlay=tmp_path / "o", console_log=tmp_path / "c"))
        balloons = root.findall("./devices/memballoon")
        assert [b.get("model") for b in balloons] == ["virtio"]
        assert balloons[0].find("stats").get("period") == str(BALLOON_STATS_PERIOD_S)  # type: ignore[union-attr]


@pytest.mark.libvirt
def test_profiler_reads_swap_outs_and_a_state_saved_without_a_balloon_still_restores(
    tmp_path: Path, test_nodes: dict[str, str]
) -> None:
    """On the test driver (its memoryStats are constants: swap in/out 0): the new domain has the
    balloon and its swap-outs are read as 0, not unknown; a state saved from a domain defined
    the old way (`memballoon model='none'`) restores, here and on another node, with the device
    set it was saved with — restores take the state's own XML (provisioning.driver)."""
    base = tmp_path / "base.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "64M"], check=True, timeout=30)
    cfg = ProvisioningConfig(nodes=test_nodes, snapshot_dir=str(tmp_path / "snap" / "{node}"), operation_timeout_s=30)
    with Driver(cfg, data_dir=tmp_path / "data") as drv:
        drv.define(VMSpec("new", base), "n1")
        drv.boot("new", "n1")
        prof = Profiler(drv.connection("n1"))
        prof.enable("new")
        s = prof.sample(["new"])["new"]
        assert s.swap_out_kib == 0 and s.swap_in_kib == 0

        drv.define(VMSpec("old", base), "n1")
        conn = drv.connection("n1")
        root = ET.fromstring(conn.lookupByName("old").XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        for b in root.findall("./devices/memballoon"):
            b.attrib.clear()
            b.set("model", "none")
            for child in list(b):
                b.remove(child)
        conn.defineXML(ET.tostring(root, encoding="unicode"))  # as vjob defined domains before
        drv.boot("old", "n1")
        drv.save("old", "n1")
        assert "memballoon model='none'" in conn.saveImageGetXMLDesc(str(drv.state_path("old", "n1")), 0)
        drv.restore("old", "n1")
        restored = ET.fromstring(conn.lookupByName("old").XMLDesc(0))
        assert [b.get("model") for b in restored.findall("./devices/memballoon")] == ["none"]
        drv.snapshot("old", "n1", label="t1")
        drv.delete("old", "n1")
        drv.restore_snapshot("old", "n2", label="t1", from_node="n1")
        there = ET.fromstring(drv.connection("n2").lookupByName("old").XMLDesc(0))
        assert [b.get("model") for b in there.findall("./devices/memballoon")] == ["none"]
