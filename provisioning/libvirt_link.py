"""The driver's libvirt connections, and every libvirt call made under a timeout.

Why one place for this: a libvirt call can hang (an unreachable qemu+ssh:// host, a libvirtd
stuck on a save), and the agent must not hang with it. Every call goes through `call`, which
gives up after `operation_timeout_s` and turns libvirt's errors into a `DriverError` naming
the VM, the node, its URI and libvirt's own message.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self, TypeVar

import libvirt

from provisioning import kvm_access, transfer
from provisioning.vm_places import VMPlaces
from provisioning.vm_types import DriverError, check_name
from vjob import log
from vjob.config import ProvisioningConfig

T = TypeVar("T")

# libvirt prints every error on stderr even when the caller handles it; we raise them instead.
libvirt.registerErrorHandler(lambda _ctx, _err: None, None)

_log = log.get("provisioning")

ACTIVE_STATES = (
    libvirt.VIR_DOMAIN_RUNNING,
    libvirt.VIR_DOMAIN_PAUSED,
    libvirt.VIR_DOMAIN_BLOCKED,
    libvirt.VIR_DOMAIN_PMSUSPENDED,
)
"""The domain states in which a VM holds its memory on the node (running or about to run)."""


class LibvirtLink(VMPlaces):
    """The places of a set of nodes, each reached through its own libvirt URI.

    Connections are opened on first use and kept: a test-driver node file lives only as long
    as its connection, and reconnecting per call would cost more than the call.
    """

    def __init__(self, config: ProvisioningConfig, *, data_dir: Path) -> None:
        super().__init__(config, data_dir=data_dir)
        self._conns: dict[str, libvirt.virConnect] = {}
        self._lock = threading.Lock()
        self._kvm_checked = False

    def connection(self, node: str) -> libvirt.virConnect:
        with self._lock:
            conn = self._conns.get(node)
            if conn is not None and conn.isAlive():
                return conn
            uri = self.uri(node)
            # An unreachable qemu+ssh:// host must not hang the agent: open under the timeout too.
            conn = self.call("connection", "-", node, lambda: libvirt.open(uri))
            self._conns[node] = conn
            self._warn_kvm_access(uri)
            return conn

    def _warn_kvm_access(self, uri: str) -> None:
        """Say once when this machine's libvirt will re-probe QEMU at every domain start.

        Why a warning and not a repair: /dev/kvm's owner and mode are the node's setup, not
        the driver's; but the cost is seconds per boot, define and restore (kvm_access).
        """
        local = uri.startswith(("qemu:///system", "qemu+unix:///system"))
        if self._kvm_checked or not local:
            return
        self._kvm_checked = True
        if kvm_access.qemu_user_locked_out(self.config.qemu_user):
            _log.warning(
                "libvirt re-probes QEMU at every domain start: /dev/kvm is usable by root but not by "
                f"{self.config.qemu_user}; {kvm_access.FIX}",
                uri=uri,
            )

    def close(self) -> None:
        with self._lock:
            for conn in self._conns.values():
                try:
                    conn.close()
                except libvirt.libvirtError:
                    continue
            self._conns.clear()
        transfer.close_connections()  # the shared ssh connections to other hosts (transfer.SHARE_CONNECTIONS)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def call(
        self,
        what: str,
        vm: str,
        node: str,
        fn: Callable[[], T],
        *,
        on_timeout: Callable[[], object] | None = None,
        timeout_s: float | None = None,
    ) -> T:
        """Run one libvirt call with the operation timeout, turning errors into DriverError."""
        limit = timeout_s or self.config.operation_timeout_s
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread below
                box["error"] = exc

        worker = threading.Thread(target=target, name=f"libvirt-{what}-{vm}", daemon=True)
        worker.start()
        worker.join(limit)
        if worker.is_alive():
            if on_timeout is not None:
                try:
                    on_timeout()
                except libvirt.libvirtError as exc:
                    _log.warning("abort after timeout failed", vm=vm, node=node, error=exc.get_error_message())
            raise DriverError(what, vm, node, f"no answer from {self.uri(node)} within {limit:.0f} s")
        if "error" in box:
            exc = box["error"]
            if isinstance(exc, libvirt.libvirtError):
                raise DriverError(what, vm, node, f"{self.uri(node)}: {exc.get_error_message()}") from None
            raise exc
        return box.get("value")  # type: ignore[return-value]

    def domain(self, vm: str, node: str) -> libvirt.virDomain | None:
        """The domain `vm` on `node`, None when the node knows no such VM."""
        conn = self.connection(node)
        try:
            return conn.lookupByName(check_name("vm", vm))
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise DriverError("lookup", vm, node, f"{self.uri(node)}: {exc.get_error_message()}") from None

    def require_domain(self, what: str, vm: str, node: str) -> libvirt.virDomain:
        dom = self.domain(vm, node)
        if dom is None:
            raise DriverError(what, vm, node, f"no such domain at {self.uri(node)}")
        return dom

    @staticmethod
    def active(dom: libvirt.virDomain) -> bool:
        return dom.state()[0] in ACTIVE_STATES
