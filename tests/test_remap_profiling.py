"""Online profiling through libvirt domain statistics, on libvirt's test driver."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import libvirt
import pytest

from preemption.remap.models import SubCluster, compute_time, thrashing
from preemption.remap.online import profile_from_window
from provisioning.profiling import DomainSample, Profiler, window
from provisioning.vm_types import DriverError
from tests.services.libvirt import make_test_node

pytestmark = pytest.mark.libvirt

DOMAIN = """<domain type='test'><name>{name}</name><memory>524288</memory><vcpu>2</vcpu>
<os><type>hvm</type></os><devices><interface type='ethernet'><target dev='vnet{n}'/></interface></devices>
</domain>"""


@pytest.fixture
def conn(tmp_path: Path) -> libvirt.virConnect:
    c = libvirt.open(make_test_node(tmp_path, "n1"))
    for n, name in enumerate(("vm1", "vm2")):
        c.defineXML(DOMAIN.format(name=name, n=n)).create()
    c.defineXML(DOMAIN.format(name="off", n=9))  # defined, not running: not sampled
    yield c
    c.close()


def test_samples_every_running_domain_and_counts_its_own_cost(conn: libvirt.virConnect) -> None:
    p = Profiler(conn)
    first = p.sample()
    assert set(first) == {"vm1", "vm2"}
    s = first["vm1"]
    assert s.vcpus == 2 and s.cpu_time_ns > 0 and s.net_packets > 0
    again = p.sample(["vm1"])
    assert set(again) == {"vm1"} and again["vm1"].t > s.t
    w = window(s, again["vm1"])
    assert w.seconds > 0 and w.net_bytes >= 0 and 0 <= w.cpu_share
    assert p.samples == 2 and p.overhead_s > 0


def test_a_sample_carries_the_domains_current_memory_as_libvirt_holds_it(conn: libvirt.virConnect) -> None:
    # The migration cost's memory comes from the hypervisor (root's view), not from the pilot's
    # state file: the domain's current memory, which follows its balloon.
    p = Profiler(conn)
    assert p.sample(["vm1"])["vm1"].memory_kib == 524288
    conn.lookupByName("vm1").setMemoryFlags(262144, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    assert p.sample(["vm1"])["vm1"].memory_kib == 262144


def test_perf_events_the_host_offers_are_enabled(conn: libvirt.virConnect) -> None:
    on = Profiler(conn).enable("vm1")
    assert on == ["instructions", "cpu_cycles", "cache_misses"]
    flags = conn.lookupByName("vm1").perfEvents()
    assert all(flags[e] for e in on) and not flags["branch_misses"]


def test_unknown_domain_is_an_error_naming_it(conn: libvirt.virConnect) -> None:
    with pytest.raises(DriverError, match="profile of VM ghost on node test://"):
        Profiler(conn).sample(["ghost"])


def _s(t: float, cpu_s: float, swap_kib: int, nbytes: int, pkts: int, ins: int) -> DomainSample:
    perf = MappingProxyType({"instructions": ins})
    return DomainSample("vm", t, int(cpu_s * 1e9), 2, swap_kib, 0, nbytes, pkts, perf)


def test_window_deltas_and_the_profile_the_models_get() -> None:
    a = _s(100.0, 10.0, 0, 1_000, 10, 10**9)
    b = _s(150.0, 110.0, 4 * 100_000, 1_000 + 64_000 * 500, 10 + 500, 10**9 + 5 * 10**11)
    w = window(a, b)
    assert w.seconds == 50 and w.cpu_s == pytest.approx(100) and w.cpu_share == pytest.approx(1.0)
    assert w.swap_in_pages_s == pytest.approx(2000) and w.perf["instructions"] == 5 * 10**11
    prof = profile_from_window(w)
    assert prof.blocking == {64_000: 500.0} and prof.counters == {"instructions": 5e11}
    assert thrashing(prof, 1000)
    fast = SubCluster("B", 1, 4, 4096, 3.0, cycles={"instructions": 0.5})
    assert compute_time(prof, fast) == pytest.approx(5e11 * 0.5 / 3e9)
    back = window(b, _s(200.0, 1.0, 0, 0, 0, 0))
    assert back.cpu_s == 0 and back.net_packets == 0  # counters reset (restart, migration): no negatives
    with pytest.raises(ValueError, match="not later"):
        window(b, a)


def test_without_perf_events_cpu_time_and_the_clock_ratio_price_the_window() -> None:
    a = DomainSample("vm", 0.0, 0, 1)
    b = DomainSample("vm", 50.0, int(40e9), 1)  # 40 s of CPU in a 50 s window
    prof = profile_from_window(window(a, b), freq_ghz=1.5)
    slow = SubCluster("slow", 1, 1, 1024, 1.5, cycles={"cycles": 1.0})
    fast = SubCluster("fast", 1, 1, 1024, 3.0, cycles={"cycles": 1.0})
    assert compute_time(prof, slow) == pytest.approx(40.0)
    assert compute_time(prof, fast) == pytest.approx(20.0)
    assert profile_from_window(window(a, b)).counters == {}  # no clock given: no computation model
