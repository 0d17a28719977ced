"""The VM driver seen as the context-switch executor's action performer.

Why a separate adapter: the executor (preemption.executor.ActionPerformer) speaks the
Entropy actions — run, stop, suspend, resume (local or remote), migrate — while the driver
speaks libvirt operations. `run` must also know what to boot, which the plan does not say:
`spec_for(vm)` answers it (from the job's OS image and size). Every call is idempotent
because the driver's are, so the executor may retry an action after a crash.
"""

from __future__ import annotations

from collections.abc import Callable

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
