"""The contract between the agent and an RMS adapter (plugins/slurm, plugins/pbs, plugins/oar).

Why a Protocol: the agent loop (observe → decide → act → record) is the same for every RMS;
only observing and acting differ. An adapter turns the RMS's view into model objects and
carries out the few actions vjob needs, raising CommandError naming the command and job.
"""

from __future__ import annotations

from typing import Protocol

from vjob.model import Job, Node


class RMSAdapter(Protocol):
    """What the agent needs from a resource manager."""

    name: str

    def jobs(self) -> list[Job]:
        """Every job the RMS knows that is pending, held, running or suspended."""
        ...

    def nodes(self) -> list[Node]:
        """Every compute node with its state."""
        ...

    def set_priority(self, job_id: str, value: int) -> None:
        """Give a pending job vjob's priority (Slurm: site factor; PBS: qalter -p)."""
        ...

    def hold(self, job_id: str) -> None: ...

    def release(self, job_id: str) -> None: ...

    def requeue_hold(self, job_id: str) -> None:
        """Put a running job back in the queue, held (after its VMs were checkpointed)."""
        ...
