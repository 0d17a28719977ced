"""The VM driver seen as the context-switch executor's action performer.

Why a separate adapter: the executor (preemption.executor.ActionPerformer) speaks the
Entropy actions — run, stop, suspend, resume (local or remote), migrate — while the driver
speaks libvirt operations. `run` must also know what to boot, which the plan does not say:
`spec_for(vm)` answers it (from the job's OS image and size). Every call is idempotent
because the driver's are, so the executor may retry an action after a crash.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from provisioning import coordinated
from provisioning.coordinated import Member
from provisioning.driver import Driver, VMSpec


class DriverPerformer:
    """Implements preemption.executor.ActionPerformer (structurally) over a Driver."""

    def __init__(
        self,
        driver: Driver,
        spec_for: Callable[[str], VMSpec],
        *,
        job_id_for: Callable[[str], int | None] | None = None,
    ) -> None:
        self.driver = driver
        self.spec_for = spec_for
        self.job_id_for = job_id_for or (lambda _vm: None)

    def run(self, vm: str, node: str) -> None:
        self.driver.define(self.spec_for(vm), node, job_id=self.job_id_for(vm))
        self.driver.boot(vm, node)

    def stop(self, vm: str, node: str) -> None:
        self.driver.stop(vm, node)

    def suspend(self, vm: str, node: str) -> None:
        self.driver.save(vm, node, job_id=self.job_id_for(vm))

    def resume(self, vm: str, node: str, source: str | None) -> None:
        self.driver.restore(vm, node, from_node=source or node)

    def migrate(self, vm: str, source: str, destination: str) -> None:
        self.driver.migrate(vm, source, destination)

    def suspend_job(self, actions: Sequence[Any]) -> None:
        """preemption.executor.JobPerformer: a multi-VM job's suspends as one consistent cut."""
        members = [Member(a.vm, _where(a.src, a)) for a in actions]
        coordinated.checkpoint(self.driver, members, job_id=self.job_id_for(actions[0].vm))

    def resume_job(self, actions: Sequence[Any]) -> None:
        """Every VM of the job restored paused (copied from `src` when elsewhere), then run together."""
        coordinated.restore(self.driver, [Member(a.vm, _where(a.dst, a), from_node=a.src or None) for a in actions])


def _where(node: str | None, action: Any) -> str:
    if node is None:
        raise ValueError(f"{action.kind.value} {action.vm}: the plan gives no node")
    return node
