"""OAR's word on a job for the node service (provisioning.node_service.grant.JobAuthority).

From `oarstat -f -J -j J` (or the REST API's job): its state (only "Running" grants), its
owner's name, its hosts and its resource ids; `oarnodes -J` maps each resource to a host, so a
node's CPUs are the job's resources on it (one per core, as the sites' resources are declared).
The uid and gid are the owner's on this node (OAR runs the job as that login, through the
node's name service). OAR records no memory per job (plugins/oar/allocation.py): 0, meaning
unknown, and operations treat it so.
"""

from __future__ import annotations

import pwd
from collections.abc import Sequence
from typing import Any

from plugins.oar.client import OarClient, check_job_id
from plugins.oar.parse import OarJob
from provisioning.node_service.grant import Grant
from vjob.errors import InputError


class OarJobAuthority:
    """JobAuthority over an OAR client (the commands, as root, or the REST API)."""

    rms = "oar"

    def __init__(self, client: OarClient) -> None:
        self.client = client

    def grant(self, job: str, node: str) -> Grant | None:
        found = self.client.job(check_job_id(job), user="")
        if found is None or found.state != "Running" or node not in found.hosts:
            return None
        return grant_of(found, self.client.resources(), node)

    def owned(self, job: str, node: str) -> Grant | None:
        found = self.client.job(check_job_id(job), user="")
        if found is None:
            return None
        if found.state == "Running" and node in found.hosts:
            return grant_of(found, self.client.resources(), node)
        try:
            owner = pwd.getpwnam(found.user)
        except KeyError:
            return None
        return Grant("oar", found.id, owner.pw_uid, owner.pw_gid, found.user, node, tuple(found.hosts), 0, 0)


def grant_of(job: OarJob, resources: Sequence[dict[str, Any]], node: str) -> Grant | None:
    """The grant of a Running `job` on `node` (one of its hosts), else None."""
    if job.state != "Running" or node not in job.hosts:
        return None
    hosts = {_id(r): r["network_address"] for r in resources}
    cpus = sum(1 for rid in job.resources if hosts.get(rid) == node)
    if cpus == 0:
        raise InputError(f"OAR job {job.id}: none of its resources {list(job.resources)[:8]} is on node {node!r}")
    try:
        owner = pwd.getpwnam(job.user)
    except KeyError:
        raise InputError(f"OAR job {job.id}: its user {job.user[:40]!r} is not known on this node") from None
    return Grant("oar", job.id, owner.pw_uid, owner.pw_gid, job.user, node, tuple(job.hosts), cpus, 0)


def _id(resource: dict[str, Any]) -> int:
    return int(resource.get("resource_id", resource.get("id", -1)))
