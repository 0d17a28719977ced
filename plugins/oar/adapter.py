"""The OAR adapter the agent uses (`vjob agent --rms oar`): observe jobs and nodes, hold/release.

Why OAR lacks set_priority and requeue_hold here: OAR has no per-job priority a site can set
from outside (queues order jobs), and a running job cannot be put back in the queue; vjob's
answer on OAR is the Saline manager, which resubmits a killed best-effort vjob itself. Asking
for either is an error naming the job, never a silent no-op.
"""

from __future__ import annotations

from plugins.oar.client import OarClient, OarCommands, check_job_id
from plugins.oar.parse import nodes_from_resources
from vjob.errors import VjobError
from vjob.model import Job, Node
from vjob.rms import Abilities, JobEnvironment

ENVIRONMENT = JobEnvironment(job_id="OAR_JOB_ID", node_name="OAR_NODENAME", node_list="OAR_NODEFILE")


class OarAdapter:
    """`vjob.rms.RMSAdapter` over one OAR server (commands or REST)."""

    name = "oar"

    def __init__(self, client: OarClient) -> None:
        self.client = client
        commands = isinstance(client, OarCommands)  # oarhold/oarresume have no REST equivalent here
        self.abilities = Abilities(
            priority=None,
            requeue_hold=False,
            hold_release=commands,
            suspend=False,
            pin_nodes=False,
            start_now=False,
            environment=ENVIRONMENT,
        )

    def jobs(self) -> list[Job]:
        return [j.to_job() for j in self.client.jobs() if not j.finished]

    def nodes(self) -> list[Node]:
        busy = {r for j in self.client.jobs() if j.state == "Running" for r in j.resources}
        return nodes_from_resources(self.client.resources(), busy=busy)

    def set_priority(self, job_id: str, value: int) -> None:
        raise VjobError(f"OAR job {job_id}: OAR has no per-job priority to set (use queues)")

    def hold(self, job_id: str) -> None:
        if not isinstance(self.client, OarCommands):
            raise VjobError(f"OAR job {job_id}: hold needs the OAR commands (oarhold), not the REST API")
        self.client.hold(check_job_id(job_id))

    def release(self, job_id: str) -> None:
        if not isinstance(self.client, OarCommands):
            raise VjobError(f"OAR job {job_id}: release needs the OAR commands (oarresume), not the REST API")
        self.client.release(check_job_id(job_id))

    def requeue_hold(self, job_id: str) -> None:
        raise VjobError(
            f"OAR job {job_id}: OAR cannot requeue a running job; best-effort vjobs are resubmitted "
            "by the Saline manager (vjob besteffort manager)"
        )

    def tell_wait(self, job_id: str, reason: str | None) -> bool:
        raise VjobError(
            f"OAR job {job_id}: OAR has no job field an administrator sets through its commands (`oarstat`'s "
            "message is the scheduler's); the wait reason is in `vjob status`"
        )
