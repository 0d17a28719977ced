"""From a libvirt profiling window (provisioning.profiling) to the models' Profile.

Why this mapping: the hypervisor counts hardware events (the computation model's counters,
under libvirt's perf names) and interface packets, not MPI messages; a window's packets are
taken as blocking messages of the window's mean packet size — the communication model then
prices them at each sub-cluster's latency for that size. Swap-ins give thrashing directly.
A host that offers no perf events (containers, most clouds) still gives CPU time: with the
source's clock, CPU seconds per vCPU become one counter, "cycles" (1 cycle per cycle on every
sub-cluster), so the computation model reduces to the clock ratio.
"""

from __future__ import annotations

from collections.abc import Mapping

from preemption.remap.models import Profile, SubCluster
from preemption.remap.policy import Decision, RemapParams, decide, running_job
from provisioning.profiling import DomainSample, Profiler, Window, window

CYCLES = "cycles"
"""The counter made from CPU time when the host has no perf events (sub-clusters: cycles = 1)."""


def profile_from_window(w: Window, freq_ghz: float | None = None) -> Profile:
    """The Profile of one sampled window of one VM; `freq_ghz` (the source sub-cluster's clock)
    turns CPU time into a cycles counter when the window has no perf events."""
    counters = {e: float(v) for e, v in w.perf.items()}
    if not counters and freq_ghz is not None:
        counters[CYCLES] = w.cpu_share * w.seconds * freq_ghz * 1e9
    blocking: dict[int, float] = {}
    if w.net_packets > 0:
        blocking[round(w.net_bytes / w.net_packets)] = float(w.net_packets)
    return Profile(
        window_s=w.seconds,
        counters=counters,
        blocking=blocking,
        swap_in_pages_s=w.swap_in_pages_s,
        swap_out_pages_s=w.swap_out_pages_s,
    )


def profile_and_decide(
    profiler: Profiler,
    vm: str,
    last: DomainSample,
    source: str,
    farm: Mapping[str, SubCluster],
    free_slots: Mapping[str, int],
    params: RemapParams,
    *,
    memory_mb: int = 0,
    migrations: int = 0,
    migrate_s: float = 0.0,
) -> tuple[DomainSample, list[Decision]]:
    """One remapping look at one single-VM job on `source`: sample it, price the window since
    `last` on every sub-cluster, decide. Returns the new sample (the next window's start) and
    the decisions (at most one, for this VM)."""
    now = profiler.sample([vm])[vm]
    profile = profile_from_window(window(last, now), freq_ghz=farm[source].freq_ghz)
    job = running_job(
        vm,
        source,
        1,
        profile,
        farm,
        params,
        memory_mb_per_slot=memory_mb,
        migrations=migrations,
        migrate_s=migrate_s,
    )
    memory = {n: sc.memory_mb_per_slot for n, sc in farm.items()}
    return now, decide([job], free_slots, memory, params)
