"""The names both sides derive from a job id alone (the VM names, which VMs a state may claim)
and the place under a user's home both look in: never taken from a file."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from vjob.errors import InputError
from vjob.pilot_files.records import PilotState, PilotStatus

JOB_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
USER_DATA_DIR = Path(".local/share/vjob")
"""Under a user's home: where a pilot that is not root keeps its VMs (`vms/`) and saved states
(`snapshots/`) with the user's own libvirt (pilot.specs.user_provisioning, or $XDG_DATA_HOME/vjob),
and where the agent looks for a user job's saved states (agent.pilot_snapshots)."""


def validate_job_id(job_id: str) -> str:
    """Job ids become directory and VM names: only a safe alphabet is allowed."""
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        raise InputError(f"job id {job_id!r}: must be 1-64 characters of letters, digits, '.', '_' or '-'")
    return job_id


def vm_name(rms: str, job_id: str) -> str:
    """The libvirt domain name of a vjob of one VM, and the base of the names of a vjob of
    several (vm_names): derived from the job id, never taken from a file."""
    return f"vjob-{rms}-{validate_job_id(job_id)}"


def member_names(vm: str, count: int) -> list[str]:
    """The VM names of a multi-node vjob of `count` VMs, one per node: `<vm>-<rank>`, rank 0
    (the one running the script, pilot.multinode) first."""
    return [f"{vm}-{rank}" for rank in range(count)]


def vm_names(rms: str, job_id: str, count: int = 1) -> list[str]:
    """Every VM name of a vjob of `count` VMs, rank 0 first, from its job id alone: one VM is
    `vjob-<rms>-<id>`, a vjob of several (a VM per node) has `vjob-<rms>-<id>-<rank>`, rank <
    count. Why one function: the pilot names its VMs with it, and the agent believes no other
    name a state file gives (claimed_vms) — nor deletes any (the store records these)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InputError(f"VM count {str(count)[:20]!r}: must be an integer >= 1")
    base = vm_name(rms, job_id)
    return [base] if count == 1 else member_names(base, count)


def vms_of(st: PilotStatus) -> list[tuple[str, str]]:
    """(VM, node) of each VM a pilot's state speaks of, rank 0 (the state's `vm`) first: each
    `<vm>-<rank>` of a multi-node pilot on the node its `member_nodes` names, else its one VM on
    its node (the node it was saved on, while saved). Only for a state claimed_vms accepted (the
    agent's observation holds no other): the names are then the ones derived from the job id."""
    if len(st.member_nodes) > 1 and st.vm.endswith("-0"):
        names = member_names(st.vm.removesuffix("-0"), len(st.member_nodes))
        return list(zip(names, st.member_nodes, strict=True))
    return [(st.vm, (st.saved_node or st.node) if st.state is PilotState.SAVED else st.node)]


def claimed_vms(rms: str, job_id: str, st: PilotStatus, *, max_vms: int | None = None) -> list[tuple[str, str]]:
    """(VM, node) of each VM the state `st`, read from job `job_id`'s pilot directory, speaks
    of (vms_of), once it is checked to claim only that job's VMs: its `job_id` is the job's, its
    `vm` is rank 0's name derived from the job id for as many VMs as `member_nodes` lists (one
    when it lists none), one per node (no node twice), at most `max_vms` (the nodes of the
    cluster: the RMS's count for the job itself is not steady — Slurm shows a requeued job with
    one node while it winds up). InputError naming the field and value otherwise. Where a VM's
    node matters (recording it, checkpointing it) the agent also checks the RMS allocated it."""
    where = f"pilot state of job {job_id}"
    if st.job_id != job_id:
        raise InputError(f"{where}: field 'job_id' = {st.job_id[:80]!r}: not this job")
    count = max(1, len(st.member_nodes))
    if max_vms is not None and count > max_vms:
        raise InputError(f"{where}: field 'member_nodes' lists {count} nodes: the cluster has {max_vms}")
    twice = sorted(n for n, times in Counter(st.member_nodes).items() if times > 1)
    if twice:
        raise InputError(f"{where}: field 'member_nodes' names {', '.join(twice)[:80]!r} twice: one VM per node")
    first = vm_names(rms, job_id, count)[0]
    if st.vm != first:
        raise InputError(f"{where}: field 'vm' = {st.vm[:80]!r}: must be {first!r} (a vjob of {count} VM(s))")
    return vms_of(st)
