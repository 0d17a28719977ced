"""Online profiling of running VMs through libvirt's domain statistics (ARRIVE-F's input).

Why libvirt's statistics and not an agent in the guest: the paper insists on profiling
without touching the job, and the hypervisor already counts what its models need — CPU time
(is the job CPU-bound), hardware events where the host offers perf (instructions, cycles,
cache misses: the computation model's counters), swap-ins and major faults from the balloon
driver (thrashing), and the bytes and packets of every interface (the communication model;
libvirt cannot see MPI, so packets stand for messages of the window's mean size).

One bulk call (`getAllDomainStats`) samples every domain of a node; a driver that leaves a
group out of it (older libvirt, the test driver) is asked per domain instead. The time spent
sampling is kept (`Profiler.overhead_s`) so its share of a window can be reported.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import libvirt

from provisioning.vm_types import DriverError
from vjob import log

_log = log.get(__name__)

PERF_EVENTS = ("instructions", "cpu_cycles", "cache_misses")
"""Hardware events asked for when the host offers them (the computation model's counters)."""
STATS = (
    libvirt.VIR_DOMAIN_STATS_CPU_TOTAL
    | libvirt.VIR_DOMAIN_STATS_BALLOON
    | libvirt.VIR_DOMAIN_STATS_VCPU
    | libvirt.VIR_DOMAIN_STATS_INTERFACE
    | libvirt.VIR_DOMAIN_STATS_PERF
)
PAGE_KIB = 4
_VCPU_DELAY = re.compile(r"vcpu\.[0-9]{1,4}\.delay")
_TARGET_DEV = re.compile(r"<target dev=['\"]([A-Za-z0-9_.:-]{1,64})['\"]\s*/>")


@dataclass(frozen=True, slots=True)
class DomainSample:
    """Cumulative counters of one domain at one instant (monotonic seconds)."""

    name: str
    t: float
    cpu_time_ns: int
    vcpus: int
    swap_in_kib: int = 0
    major_faults: int = 0
    net_bytes: int = 0
    net_packets: int = 0
    perf: Mapping[str, int] = field(default_factory=dict)
    swap_out_kib: int | None = None
    """None: the guest reports no swap-outs (no balloon statistics)."""
    memory_kib: int | None = None
    """The domain's current memory (its balloon's size) as the hypervisor holds it: what a live
    migration copies, read by root, not declared by the job. None when libvirt would not say."""
    rss_kib: int | None = None
    """QEMU's resident set on the host (balloon.rss): what the node really gives the VM, its
    emulator's own memory included. None when libvirt would not say (the test driver)."""
    vcpu_delay_ns: int | None = None
    """Sum over the vCPUs of the time each was runnable but waiting for a host CPU (libvirt's
    vcpu.N.delay, the kernel's schedstat run delay): what tells a starved VM from an idle one.
    None when the host does not report it."""


@dataclass(frozen=True, slots=True)
class Window:
    """What a domain did between two samples: the profile of one window τ."""

    name: str
    seconds: float
    cpu_s: float
    cpu_share: float
    """CPU time over (seconds × vCPUs): near 1 for a CPU-bound job."""
    swap_in_pages_s: float
    major_faults_s: float
    swap_out_pages_s: float | None
    """None when either sample lacks swap-outs (no balloon statistics in the guest)."""
    net_bytes: int
    net_packets: int
    perf: Mapping[str, int]


def window(a: DomainSample, b: DomainSample) -> Window:
    """The deltas from `a` to `b` (same domain, `b` later); counters that went back (a restart,
    a migration to a host that counts afresh) give 0, never a negative rate."""
    if a.name != b.name:
        raise ValueError(f"window of two domains: {a.name} and {b.name}")
    dt = b.t - a.t
    if dt <= 0:
        raise ValueError(f"window of domain {a.name}: the second sample is not later ({dt:.3f} s)")

    def d(x: int, y: int) -> int:
        return max(0, y - x)

    cpu_s = d(a.cpu_time_ns, b.cpu_time_ns) / 1e9
    swap_out = None
    if a.swap_out_kib is not None and b.swap_out_kib is not None:
        swap_out = d(a.swap_out_kib, b.swap_out_kib) / PAGE_KIB / dt
    return Window(
        name=a.name,
        seconds=dt,
        cpu_s=cpu_s,
        cpu_share=cpu_s / (dt * max(1, b.vcpus)),
        swap_in_pages_s=d(a.swap_in_kib, b.swap_in_kib) / PAGE_KIB / dt,
        major_faults_s=d(a.major_faults, b.major_faults) / dt,
        swap_out_pages_s=swap_out,
        net_bytes=d(a.net_bytes, b.net_bytes),
        net_packets=d(a.net_packets, b.net_packets),
        perf=MappingProxyType({e: d(a.perf.get(e, 0), v) for e, v in b.perf.items()}),
    )


class Profiler:
    """Samples the running domains of one libvirt connection; keeps its own cost."""

    def __init__(self, conn: libvirt.virConnect, clock: Callable[[], float] = time.monotonic) -> None:
        self.conn = conn
        self.clock = clock
        self.overhead_s = 0.0
        self.samples = 0

    def enable(self, name: str, *, perf: Iterable[str] = PERF_EVENTS, memory_period_s: int = 5) -> list[str]:
        """Turn on the balloon's statistics and the perf events the host offers; returns the
        events now counted (empty where the host has no perf or the guest no balloon)."""
        dom = self._domain(name)
        try:
            dom.setMemoryStatsPeriod(memory_period_s, libvirt.VIR_DOMAIN_AFFECT_LIVE)
        except libvirt.libvirtError as exc:
            _log.info("no balloon statistics", vm=name, reason=exc.get_error_message())
        on = []
        for event in perf:
            try:
                dom.setPerfEvents({event: True}, libvirt.VIR_DOMAIN_AFFECT_LIVE)
                on.append(event)
            except libvirt.libvirtError as exc:
                _log.info("perf event not offered", vm=name, perf_event=event, reason=exc.get_error_message())
        return on

    def sample(self, names: Iterable[str] | None = None) -> dict[str, DomainSample]:
        """One sample of every running domain (or of `names`), by name."""
        started = time.perf_counter()
        try:
            doms = [self._domain(n) for n in names] if names is not None else None
            flags = libvirt.VIR_CONNECT_GET_ALL_DOMAINS_STATS_ACTIVE if doms is None else 0
            try:
                pairs = (
                    self.conn.getAllDomainStats(STATS, flags)
                    if doms is None
                    else self.conn.domainListGetStats(doms, STATS, 0)
                )
            except libvirt.libvirtError as exc:
                raise DriverError("profile", "*", self.conn.getURI(), exc.get_error_message()) from None
            t = self.clock()
            out = {dom.name(): self._from_stats(dom, stats, t) for dom, stats in pairs}
        finally:
            self.overhead_s += time.perf_counter() - started
            self.samples += 1
        return out

    def _domain(self, name: str) -> libvirt.virDomain:
        try:
            return self.conn.lookupByName(name)
        except libvirt.libvirtError as exc:
            raise DriverError("profile", name, self.conn.getURI(), exc.get_error_message()) from None

    def _from_stats(self, dom: libvirt.virDomain, stats: Mapping[str, Any], t: float) -> DomainSample:
        name = dom.name()
        if "cpu.time" in stats:
            cpu = int(stats["cpu.time"])
            vcpus = int(stats.get("vcpu.current", 1))
            swap_in = int(stats.get("balloon.swap_in", 0))
            faults = int(stats.get("balloon.major_fault", 0))
            out = stats.get("balloon.swap_out")
            swap_out = None if out is None else int(out)
            count = int(stats.get("net.count", 0))
            nbytes = sum(int(stats.get(f"net.{i}.{d}.bytes", 0)) for i in range(count) for d in ("rx", "tx"))
            npkts = sum(int(stats.get(f"net.{i}.{d}.pkts", 0)) for i in range(count) for d in ("rx", "tx"))
        else:  # the driver's bulk call left the groups out: ask this domain one by one
            cpu, vcpus, swap_in, faults, swap_out, nbytes, npkts = self._per_domain(dom)
        perf = {k[5:]: int(v) for k, v in stats.items() if k.startswith("perf.")}
        current = stats.get("balloon.current")
        memory = int(current) if current is not None else _current_kib(dom)
        rss = stats.get("balloon.rss")
        delays = [int(v) for k, v in stats.items() if _VCPU_DELAY.fullmatch(k)]
        counters = (swap_in, faults, nbytes, npkts, MappingProxyType(perf), swap_out, memory)
        rss_kib = None if rss is None else int(rss)
        return DomainSample(name, t, cpu, vcpus, *counters, rss_kib, sum(delays) if delays else None)

    def _per_domain(self, dom: libvirt.virDomain) -> tuple[int, int, int, int, int | None, int, int]:
        try:
            cpu = int(dom.getCPUStats(True)[0]["cpu_time"])
            vcpus = int(dom.info()[3])
            mem = dom.memoryStats()
            nbytes = npkts = 0
            for dev in _TARGET_DEV.findall(dom.XMLDesc(0)):
                try:
                    rx_b, rx_p, _, _, tx_b, tx_p, _, _ = dom.interfaceStats(dev)
                except libvirt.libvirtError:
                    continue  # a disk's target dev, or an interface without statistics
                nbytes += rx_b + tx_b
                npkts += rx_p + tx_p
        except libvirt.libvirtError as exc:
            raise DriverError("profile", dom.name(), self.conn.getURI(), exc.get_error_message()) from None
        out = mem.get("swap_out")
        swap_out = None if out is None else int(out)
        return cpu, vcpus, int(mem.get("swap_in", 0)), int(mem.get("major_fault", 0)), swap_out, nbytes, npkts


def node_sampler(connection: Callable[[str], libvirt.virConnect]) -> Callable[[str], dict[str, DomainSample]]:
    """node → one sample of every domain running there, through `connection(node)` (the
    provisioning driver's, asked at each call so that a connection it reopened is used)."""

    def sample(node: str) -> dict[str, DomainSample]:
        return Profiler(connection(node)).sample()

    return sample


def _current_kib(dom: libvirt.virDomain) -> int | None:
    """The domain's current memory from its info, when the bulk statistics left the balloon out."""
    try:
        return int(dom.info()[2])
    except libvirt.libvirtError:
        return None
