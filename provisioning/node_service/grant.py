"""What the node service knows for sure about a caller before it acts: a `Grant`, built from
the kernel's peer credentials and the RMS's own record of the job, never from the request.

Why a record of its own: every operation (network, NFS, usage) takes the grant and the
request's validated fields, so an operation cannot reach for anything the check did not cover.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Grant:
    """A running job of `uid` on `node`, as the RMS reports it."""

    rms: str
    job: str
    uid: int
    gid: int
    user: str
    node: str
    """The node of this request (one the service serves, one the job holds)."""
    nodes: tuple[str, ...]
    """Every node of the job's allocation, in the RMS's order."""
    cpus: int
    """CPUs of the job on `node`."""
    memory_mib: int
    """Memory of the job on `node` (0 when the RMS sets no limit)."""


class JobAuthority(Protocol):
    """The RMS's word on a job (plugins/<rms>/job_grant.py). An authority may also answer
    `node_addresses(nodes) -> {node: address}` (Slurm's: NodeAddr), the far ends of a job's
    tunnel between hosts (provisioning.node_service.tunnel); without it a node's name is its
    host name."""

    def grant(self, job: str, node: str) -> Grant | None:
        """The job's grant on `node` when it is running there, else None."""

    def owned(self, job: str, node: str) -> Grant | None:
        """The job's grant in whatever state the RMS still lists it (requeued, completing,
        ended), for clean-up operations only: `cpus`/`memory_mib` 0 unless it runs on `node`,
        `nodes` what the RMS says now (empty while it waits). None when the RMS has no record."""


Operation = Callable[[Grant, Mapping[str, Any]], dict[str, Any]]
"""One request kind: the grant, the request's fields (already checked by the protocol) → the
answer's fields. Raises vjob.errors.InputError for a request it refuses (the message goes back)."""
