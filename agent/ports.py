"""The agent's ports: what its steps (observe, act, recover, consolidate, remap) reach the world by.

Why a ports object and not the Agent: the steps used to take the whole Agent and reach back into
the loop for its store, lease and pilot directories, so the loop and its steps were one circle.
Now the loop (agent.loop) builds one Ports and hands it down; a step sees the store with its
failure accounting, the RMS adapter, the pilot directories, the provisioning driver, metrics,
log and lease — and the one way a switch is journalled (`job_key`, `executor`) — never the
loop's own state (priorities sent, anchors, the deciders' records).
"""

from __future__ import annotations

import pwd
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.lease import Lease
from agent.metrics import AgentMetrics
from preemption.executor import Executor, KeyedPerformer
from preemption.planner.plan import PlanAction
from vjob.config import Config
from vjob.errors import StoreError
from vjob.pilot_files import PilotDir, find_dir
from vjob.rms import RMSAdapter
from vjob.store import jobs as store_jobs
from vjob.store.db import Store, open_store

if TYPE_CHECKING:
    from pathlib import Path

    from preemption.executor import ActionPerformer
    from provisioning.driver import Driver


class StoreLink:
    """The state store, opened on first use and dropped after a failure (re-opened next use).

    Call it for the store; `failed(exc)` is the one failure accounting every step applies: the
    store counted down, the error logged, the connection closed."""

    def __init__(self, cfg: Config, metrics: AgentMetrics, log: Any) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.log = log
        self.opened: Store | None = None

    def __call__(self) -> Store:
        if self.opened is None:
            self.opened = open_store(self.cfg)
        return self.opened

    def failed(self, exc: Exception) -> None:
        self.metrics.store_up.set(0)
        self.metrics.errors.labels(kind="store").inc()
        self.log.error("state store unavailable: no checkpoint or release this tick, retrying", error=str(exc))
        if self.opened is not None:
            self.opened.close()
        self.opened = None


@dataclass
class Ports:
    """What the agent's steps need of the world, for one RMS."""

    cfg: Config
    rms: str
    adapter: RMSAdapter
    metrics: AgentMetrics
    log: Any
    store: StoreLink
    lease: Lease
    root: Path
    """The pilot directories' root (vjob.pilot_files.pilot_root)."""
    pilot_dirs: dict[str, PilotDir] = field(default_factory=dict)
    """job id → the directory of it the last observation believed (owned by the job's user or
    root, agent.observe.read_pilots): where requests go, never a squatter's same-named one."""
    recorded_vms: dict[str, tuple[str, str]] = field(default_factory=dict)
    """job id → (node, image) this agent last wrote to the store's VM rows (agent.observe, and
    agent.remap_step after a move), so a placement is written once, not every tick; the nodes
    of a vjob of several VMs comma-separated, its first VM's first."""

    def pilot_dir(self, job_id: str) -> PilotDir:
        """The job's directory as last observed. Before (recovery runs ahead of the first
        observation) or for a job not heard then: the one owned by the user the store recorded
        for the job, or by root (vjob.pilot_files.find_dir); when there is none, its plain name,
        with reads and requests refused if anybody else owns that (a squatter's)."""
        known = self.pilot_dirs.get(job_id)
        if known is not None:
            return known
        uids = [0]
        try:
            record = store_jobs.get(self.store(), self.rms, job_id)
            if record is not None:
                uids.insert(0, pwd.getpwnam(record.user).pw_uid)
        except (StoreError, KeyError):
            pass  # no store, or a user without an account here: root's directory only
        found = find_dir(self.root, self.rms, job_id, uids)
        if found is not None:
            found.owners = tuple(uids)
            return found
        return PilotDir(self.root, self.rms, job_id, owners=uids)

    def job_key(self, action: PlanAction) -> str:
        """The journal's key of an action's job: `<rms>:<job id>` (vjob status, recovery)."""
        return f"{self.rms}:{action.vjob}"

    def executor(self, performer: ActionPerformer | KeyedPerformer, *, tag: str = "") -> Executor:
        """The one way a step builds a switch's executor: journalled in the store under this
        RMS's job keys, and stopping (abandoned) as soon as the lease no longer covers it."""
        return Executor(performer, self.store(), tag=tag, job_key=self.job_key, still_ours=self.lease.valid)

    def driver(self) -> Driver:
        """A provisioning driver over the configured nodes (libvirt: only when a step needs it)."""
        from provisioning.driver import Driver  # heavy: libvirt-python, only when a VM must be reached

        return Driver(self.cfg.provisioning, data_dir=self.cfg.data_path)


__all__ = ["Ports", "StoreLink"]
