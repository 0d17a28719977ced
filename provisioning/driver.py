"""The VM driver: a job's VMs through libvirt, from definition to suspend, resume and move.

Why these operations and no others: they are the actions of the vjob life cycle (Entropy
section 2: run, stop, suspend, resume locally or on another node, migrate) plus the periodic
snapshot Saline needs. Each is idempotent: after a crash of the agent, calling it again
finds what was already done (a domain already running, a state file already written) and
only finishes the rest, so a context switch cut in half can be completed.

Disks: every VM writes to its own qcow2 overlay over an OS image; the image is its backing
file and is never written, so one image serves every VM of every job on a node, and a
checkpoint is the overlay plus the memory state (UBIS III.D, Saline 3.1).

Snapshots hold users' memory: they are written owner-only (0600 in a 0700 directory), get a
manifest beside them and, when a store is given, a row in `snapshots` with size, sha256 and
location. A restore checks the file against both first; a missing or altered file is a
clear error and the VM is not started from a broken state.

Every libvirt call runs with a timeout (`operation_timeout_s`) and every error names the VM,
the node, its URI and libvirt's own message.

This module is the life cycle only: the types are in `vm_types`, the manifests and their
check in `integrity`, the domain XML in `domain_xml`.
"""

from __future__ import annotations

import os
import pwd
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import libvirt
from sqlalchemy import select

from provisioning import domain_xml as domxml
from provisioning import guest, integrity, kvm_access, kvm_probe, safe_dirs, save_hash, transfer
from provisioning.transfer import Endpoint
from provisioning.vm_types import (
    MANIFEST_SUFFIX,
    NAME_RE,
    OVERLAY_COPY_SUFFIX,
    STATE_SUFFIX,
    DriverError,
    Snapshot,
    SnapshotError,
    VMInfo,
    VMSpec,
    check_name,
)
from vjob import log, proc
from vjob.config import ProvisioningConfig
from vjob.errors import InputError
from vjob.model import VMState
from vjob.store.db import Store, now
from vjob.store.schema import SnapshotRecord, VMRecord

T = TypeVar("T")

# libvirt prints every error on stderr even when the caller handles it; we raise them instead.
libvirt.registerErrorHandler(lambda _ctx, _err: None, None)

_log = log.get("provisioning")

# The names other modules import from here: the types live in vm_types, the manifests in
# integrity; both stay importable from the driver so callers can move at their own pace.
_manifest = integrity.manifest_path
_read_manifest = integrity.read_manifest
_write_manifest = integrity.write_manifest
__all__ = [
    "MANIFEST_SUFFIX",
    "NAME_RE",
    "OVERLAY_COPY_SUFFIX",
    "STATE_SUFFIX",
    "Driver",
    "DriverError",
    "Snapshot",
    "SnapshotError",
    "VMInfo",
    "VMSpec",
    "check_name",
]


class Driver:
    """The VM driver for a set of nodes, each reached through its own libvirt URI.

    Connections are opened on first use and kept: a test-driver node file lives only as long
    as its connection, and reconnecting per call would cost more than the call.
    """

    def __init__(self, config: ProvisioningConfig, *, data_dir: Path, store: Store | None = None) -> None:
        self.config = config
        self.data_dir = Path(data_dir)
        self.store = store
        self._conns: dict[str, libvirt.virConnect] = {}
        self._lock = threading.Lock()
        self._kvm_checked = False

    # -- places ----------------------------------------------------------------------------
    def uri(self, node: str) -> str:
        check_name("node", node)
        return self.config.nodes.get(node, self.config.default_uri)

    def host(self, node: str) -> str | None:
        """ssh host of `node` for its files, None when they are on this machine.

        None when the copy method is local (one filesystem) or when `hosts` maps the node to ""
        (the node the driver runs on, e.g. the pilot's own node); otherwise every file of the
        node (states, manifests, overlays) is read, hashed and renamed over ssh on that host.
        """
        if self.config.copy_method == "local":
            return None
        return self.config.hosts.get(node, node) or None

    def _ep(self, path: Path, node: str) -> Endpoint:
        """`path` on `node`'s machine."""
        return Endpoint(path, self.host(node))

    def _dir(self, configured: str, default: str, node: str) -> Path:
        raw = configured or str(self.data_dir / default)
        return Path(raw.replace("{node}", check_name("node", node)))

    def vm_dir(self, node: str) -> Path:
        return self._dir(self.config.vm_dir, "vms", node)

    def snapshot_dir(self, node: str) -> Path:
        return self._dir(self.config.snapshot_dir, "snapshots", node)

    def overlay_path(self, vm: str, node: str) -> Path:
        return self.vm_dir(node) / f"{check_name('vm', vm)}.qcow2"

    def console_log(self, vm: str, node: str) -> Path:
        return self.vm_dir(node) / f"{check_name('vm', vm)}.console.log"

    def job_disk_path(self, vm: str, node: str) -> Path:
        """The VM's job disk (provisioning.job_disk): a real job's files, part of the VM."""
        return self.vm_dir(node) / f"{check_name('vm', vm)}.job.qcow2"

    def output_logs(self, vm: str, node: str) -> tuple[Path, Path]:
        """Where the guest's second and third serial ports (the job's stdout, stderr) are logged."""
        base = self.vm_dir(node) / check_name("vm", vm)
        return base.with_name(base.name + ".stdout.log"), base.with_name(base.name + ".stderr.log")

    def disk_paths(self, vm: str, node: str) -> dict[str, Path]:
        """The VM's disks on `node` by role (integrity.DISK_ROLES): what moves with its state."""
        return {"overlay": self.overlay_path(vm, node), "job_disk": self.job_disk_path(vm, node)}

    def state_path(self, vm: str, node: str) -> Path:
        return self.snapshot_dir(node) / f"{check_name('vm', vm)}{STATE_SUFFIX}"

    def _ensure_dirs(self, node: str) -> None:
        """Create or check the node's VM and snapshot directories: ours only (safe_dirs), since
        root writes users' overlays and memory states there and restores VMs from them."""
        if self.host(node) is not None:
            transfer.ensure_remote_dir(self._ep(self.vm_dir(node), node), 0o711)
            transfer.ensure_remote_dir(self._ep(self.snapshot_dir(node), node), 0o700)
            return
        vm_dir = safe_dirs.ensure_dir(self.vm_dir(node), 0o711)
        vm_dir.chmod(0o711)  # QEMU (libvirt-qemu) must traverse it; nobody may list it
        snap = safe_dirs.ensure_dir(self.snapshot_dir(node), 0o700)
        snap.chmod(0o700)

    # -- libvirt plumbing --------------------------------------------------------------------
    def connection(self, node: str) -> libvirt.virConnect:
        with self._lock:
            conn = self._conns.get(node)
            if conn is not None and conn.isAlive():
                return conn
            uri = self.uri(node)
            # An unreachable qemu+ssh:// host must not hang the agent: open under the timeout too.
            conn = self._call("connection", "-", node, lambda: libvirt.open(uri))
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

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _is_test(self, node: str) -> bool:
        return self.uri(node).startswith("test:")

    def _call(
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

    def _domain(self, vm: str, node: str) -> libvirt.virDomain | None:
        conn = self.connection(node)
        try:
            return conn.lookupByName(check_name("vm", vm))
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise DriverError("lookup", vm, node, f"{self.uri(node)}: {exc.get_error_message()}") from None

    def _require_domain(self, what: str, vm: str, node: str) -> libvirt.virDomain:
        dom = self._domain(vm, node)
        if dom is None:
            raise DriverError(what, vm, node, f"no such domain at {self.uri(node)}")
        return dom

    @staticmethod
    def _active(dom: libvirt.virDomain) -> bool:
        return dom.state()[0] in (
            libvirt.VIR_DOMAIN_RUNNING,
            libvirt.VIR_DOMAIN_PAUSED,
            libvirt.VIR_DOMAIN_BLOCKED,
            libvirt.VIR_DOMAIN_PMSUSPENDED,
        )

    # -- observe ---------------------------------------------------------------------------
    def state(self, vm: str, node: str) -> VMState | None:
        """The VM's state on `node`; None when the node knows no such VM and holds no state file."""
        dom = self._domain(vm, node)
        if dom is not None and self._active(dom):
            return VMState.RUNNING
        saved = transfer.exists(self._ep(self.state_path(vm, node), node))
        if dom is None:
            return VMState.SAVED if saved else None
        if saved:
            return VMState.SAVED
        return VMState.STOPPED if transfer.exists(self._ep(self.console_log(vm, node), node)) else VMState.DEFINED

    def list_vms(self, node: str) -> list[VMInfo]:
        conn = self.connection(node)
        out = []
        for dom in self._call("list", "-", node, conn.listAllDomains):
            name = dom.name()
            info = dom.info()
            state = self.state(name, node) or VMState.DEFINED
            out.append(VMInfo(name, node, state, int(info[1]) // 1024, int(info[3]), bool(dom.isPersistent())))
        return sorted(out, key=lambda v: v.name)

    # -- define / boot / stop / delete -------------------------------------------------------
    def define(self, spec: VMSpec, node: str, *, job_id: int | None = None) -> None:
        """Create the VM's overlay over its image and define the domain (both only once).

        On a node whose files are on another host (`host`), the overlay is created there over
        the image at the same path (`vjob image distribute` put it there), and the job disk,
        built here by the pilot, is sent there and checked on arrival (`_send_job_disk`).
        """
        self._ensure_dirs(node)
        overlay = self.overlay_path(spec.name, node)
        host = self.host(node)
        if host is not None:
            self._define_remote_overlay(spec, node, host)
        elif not overlay.exists():
            if not spec.image.is_file():
                raise DriverError("define", spec.name, node, f"image {spec.image} does not exist")
            _qemu_img(
                ["create", "-q", "-f", "qcow2", "-F", spec.image_format, "-b", str(spec.image.resolve()), str(overlay)],
                spec.name,
            )
            overlay.chmod(0o600)
            self._own_overlay(spec.name, node)
        if spec.job_disk is not None:
            if spec.job_disk != self.job_disk_path(spec.name, node):
                raise DriverError("define", spec.name, node, f"job disk {spec.job_disk}: not in the VM dir")
            if host is not None:
                self._send_job_disk(spec.name, node, spec.job_disk, host)
            elif not spec.job_disk.is_file():
                raise DriverError("define", spec.name, node, f"job disk {spec.job_disk}: missing")
            self._own_overlay(spec.name, node, spec.job_disk)
        if self._domain(spec.name, node) is None:
            xml = self.domain_xml(spec, node)
            conn = self.connection(node)
            self._call("define", spec.name, node, lambda: conn.defineXML(xml))
        self._record_vm(spec, node, job_id, overlay)
        _log.info("vm defined", vm=spec.name, node=node, overlay=str(overlay))

    def _define_remote_overlay(self, spec: VMSpec, node: str, host: str) -> None:
        """The overlay of `spec` created on `host` (once), over the image at the same path there."""
        overlay = Endpoint(self.overlay_path(spec.name, node), host)
        if transfer.exists(overlay):
            return
        image = spec.image.resolve() if spec.image.exists() else spec.image
        if not transfer.exists(Endpoint(image, host)):
            raise DriverError(
                "define", spec.name, node, f"image {image} does not exist on {host} (vjob image distribute)"
            )
        tmp = overlay.path.with_name(overlay.path.name + ".part")
        timeout = self.config.operation_timeout_s
        create = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", spec.image_format, "-b", str(image), str(tmp)]
        transfer.run_on(host, create, timeout_s=timeout)
        transfer.rename(Endpoint(tmp, host), overlay.path, mode=0o600, timeout_s=timeout)
        self._own_overlay(spec.name, node)

    def place_job_disk(self, vm: str, node: str) -> dict[str, Any]:
        """The job disk built here for `node`'s VM, put where that node's own pilot defines the
        VM (a per-node job's member whose node lacks the working directory): sent and checked
        on arrival as `define` does, or left here when the node shares this VM directory. Its
        size and sha256 as built, for that pilot to check once more before using it."""
        disk = self.job_disk_path(vm, node)
        if not disk.is_file():
            raise DriverError("define", vm, node, f"job disk {disk}: missing")
        built: dict[str, Any] = {"size_bytes": disk.stat().st_size, "sha256": transfer.sha256_file(disk)}
        host = self.host(node)
        if host is not None:
            self._ensure_dirs(node)
            self._send_job_disk(vm, node, disk, host, built)
        return built

    def _send_job_disk(self, vm: str, node: str, disk: Path, host: str, built: dict[str, Any] | None = None) -> None:
        """Send the job disk the pilot built here to `node`'s host and check it there.

        Why checked: it holds the job's files and goes to another machine by rsync/scp; the
        copy must have the size and sha256 of what was built, or the VM is not defined (the
        copy is removed there, the disk here kept for another try). Once it arrived, the copy
        here is removed: the node's is the VM's disk from now on. A vm_dir the node shares
        with this machine (seen there under the same path) needs nothing sent, and the disk is
        not removed, being the node's own.
        """
        remote = Endpoint(disk, host)
        if not disk.is_file():
            if transfer.exists(remote):
                return  # sent by an earlier call
            raise DriverError("define", vm, node, f"job disk {disk}: missing")
        if self._shares_dir(disk.parent, host):
            return
        built = built or {"size_bytes": disk.stat().st_size, "sha256": transfer.sha256_file(disk)}
        transfer.copy(Endpoint(disk), remote, method=self.config.copy_method, timeout_s=self.config.operation_timeout_s)
        try:
            integrity.check_against(vm, node, disk, built, host)
        except SnapshotError as exc:
            transfer.remove(remote)
            raise DriverError(
                "define",
                vm,
                node,
                f"the job disk sent to {host} does not match the one built ({exc}); "
                f"removed from {host}, the job disk here is kept",
            ) from None
        disk.unlink()

    @staticmethod
    def _shares_dir(directory: Path, host: str) -> bool:
        """Whether `host` sees this machine's `directory` (one filesystem): a file made here is there."""
        probe = directory / f".vjob-shared-{os.getpid()}-{threading.get_ident()}"
        probe.touch(mode=0o600)
        try:
            return transfer.exists(Endpoint(probe, host))
        finally:
            probe.unlink(missing_ok=True)

    def _own_overlay(self, vm: str, node: str, disk: Path | None = None) -> None:
        """Give the overlay to the QEMU user, 0600, and keep libvirt from relabelling it.

        Why: with dynamic ownership, the libvirtd a VM leaves restores the file's original
        owner after a migration or a save, while the QEMU on the other node still has to
        reopen it: "Permission denied" at resume, or a failed save later. A fixed owner and
        `relabel='no'` on the disk make every node agree.
        """
        if self._is_test(node) or (self.host(node) is None and os.geteuid() != 0):
            return  # a user's own libvirt (qemu:///session): QEMU runs as the user, who owns the disk
        overlay = disk or self.overlay_path(vm, node)
        host = self.host(node)
        user = self.config.qemu_user
        if host is None:
            try:
                pw = pwd.getpwnam(user)
            except KeyError:
                raise DriverError("define", vm, node, f"qemu_user {user!r} does not exist on this machine") from None
            os.chown(overlay, pw.pw_uid, pw.pw_gid)
            overlay.chmod(0o600)
        else:
            transfer.run_on(host, ["chown", f"{user}:", str(overlay)], timeout_s=60)

    def domain_xml(self, spec: VMSpec, node: str) -> str:
        """The libvirt domain XML of `spec` on `node` (type test on test:// URIs)."""
        return domxml.domain_xml(
            spec,
            dom_type="test" if self._is_test(node) else self.domain_type(node),
            overlay=self.overlay_path(spec.name, node),
            console_log=self.console_log(spec.name, node),
            job_disk=spec.job_disk,
            output_logs=self.output_logs(spec.name, node) if spec.output_ports else None,
            seclabels=not self.uri(node).endswith("/session"),
            free_page_reporting=self.config.free_page_reporting,
        )

    def domain_type(self, node: str) -> str:
        """ "kvm" or "qemu" for `node`: as configured, or for "auto" the probe's cached verdict."""
        configured = self.config.domain_type
        if configured != "auto":
            return configured
        if not kvm_probe.kvm_usable():
            return "qemu"
        verdict = kvm_probe.cached(self.config.cpu_model)
        if verdict is None:
            t0 = time.monotonic()
            verdict = "kvm" if self._probe_kvm(node) else "qemu"
            kvm_probe.remember(self.config.cpu_model, verdict, time.monotonic() - t0)
            _log.info("kvm probe", node=node, domain_type=verdict, seconds=round(time.monotonic() - t0, 1))
        return verdict

    def _probe_kvm(self, node: str) -> bool:
        """Boot the counter guest under KVM (transient) until its first COUNTER, or give up."""
        self._ensure_dirs(node)
        files = guest.build()
        name = f"vjob-kvm-probe-{os.getpid()}"
        overlay, console = self.overlay_path(name, node), self.console_log(name, node)
        _qemu_img(["create", "-q", "-f", "qcow2", str(overlay), "16M"], name)
        self._own_overlay(name, node)
        spec = VMSpec(name=name, image=overlay, memory_mib=128, kernel=files.kernel, initrd=files.initrd,
                      cmdline=files.cmdline, cpu_model=self.config.cpu_model)  # fmt: skip
        xml = domxml.domain_xml(spec, dom_type="kvm", overlay=overlay, console_log=console)
        conn = self.connection(node)
        dom = None
        try:
            dom = self._call("kvm probe", name, node, lambda: conn.createXML(xml, 0))
            deadline = time.monotonic() + kvm_probe.PROBE_TIMEOUT_S
            while time.monotonic() < deadline:
                if kvm_probe.saw_counter(console):
                    return True
                time.sleep(0.25)
            return False
        except DriverError as exc:
            _log.info("kvm probe failed to start", node=node, error=str(exc))
            return False
        finally:
            if dom is not None:
                try:
                    dom.destroy()
                except libvirt.libvirtError:
                    pass
            overlay.unlink(missing_ok=True)
            console.unlink(missing_ok=True)

    def boot(self, vm: str, node: str) -> None:
        """Start the VM; a VM already running is left alone, a saved one is refused."""
        dom = self._require_domain("boot", vm, node)
        if self._active(dom):
            return
        if transfer.exists(self._ep(self.state_path(vm, node), node)):
            raise DriverError("boot", vm, node, "it has a saved memory state: resume it (booting would lose it)")
        self._call("boot", vm, node, dom.create)
        self._update_vm(vm, node=node, state=VMState.RUNNING)
        _log.info("vm booted", vm=vm, node=node)

    def stop(self, vm: str, node: str) -> None:
        """Power the VM off (its work since the last checkpoint is lost); the overlay stays."""
        dom = self._domain(vm, node)
        if dom is None or not self._active(dom):
            return
        self._call("stop", vm, node, dom.destroy)
        self._update_vm(vm, state=VMState.STOPPED)
        _log.info("vm stopped", vm=vm, node=node)

    def delete(self, vm: str, node: str) -> None:
        """Destroy and undefine the VM and remove its overlay, state file and records."""
        dom = self._domain(vm, node)
        if dom is not None:
            if self._active(dom):
                self._call("delete", vm, node, dom.destroy)
            if dom.isPersistent():
                flags = libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
                self._call("delete", vm, node, lambda: dom.undefineFlags(flags))
        state = self.state_path(vm, node)
        paths = (self.overlay_path(vm, node), self.job_disk_path(vm, node), *self.output_logs(vm, node), state,
                 integrity.manifest_path(state))  # fmt: skip
        for path in paths:
            transfer.remove(Endpoint(path, self.host(node)))
        self._forget_snapshot(self.state_path(vm, node), node)
        if self.store is not None:
            with self.store.session() as s:
                rec = s.scalar(select(VMRecord).where(VMRecord.name == vm))
                if rec is not None:
                    s.delete(rec)
        _log.info("vm deleted", vm=vm, node=node)

    # -- suspend / resume ------------------------------------------------------------------
    def pause(self, vm: str, node: str) -> bool:
        """Pause a running VM (its vCPUs stop; memory stays): the first half of a coordinated
        checkpoint. True when the VM is now paused; False when it is not running at all."""
        dom = self._domain(vm, node)
        if dom is None or not self._active(dom):
            return False
        if dom.state()[0] != libvirt.VIR_DOMAIN_PAUSED:
            self._call("pause", vm, node, dom.suspend)
        return dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED

    def unpause(self, vm: str, node: str) -> None:
        """Let a paused VM run again (after a failed coordinated checkpoint, or a paused restore)."""
        dom = self._require_domain("unpause", vm, node)
        if dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED:
            self._call("unpause", vm, node, dom.resume)

    def save(
        self, vm: str, node: str, *, job_id: int | None = None, bypass_cache: bool = False, with_disks: bool = True
    ) -> Snapshot:
        """Suspend the VM to disk: memory state to the snapshot dir, overlay kept in place.

        A paused VM (coordinated checkpoint) is saved as running, so that its restore needs no
        extra resume. `bypass_cache` writes the state with O_DIRECT
        (VIR_DOMAIN_SAVE_BYPASS_CACHE): it does not evict the node's page cache, and a save is
        then timed like a copy that also bypasses it. Repeating it on a VM already saved
        returns the existing snapshot. `with_disks`: the overlay and job disk are hashed into
        the manifest too (integrity.disk_digests), so a copy of them is checked on arrival;
        `snapshot`, which copies the overlay itself, skips it.
        """
        self._ensure_dirs(node)
        path = self.state_path(vm, node)
        state_ep = self._ep(path, node)
        partial = path.with_name(path.name + ".part")
        dom = self._domain(vm, node)
        hashed: tuple[int, str] | None = None
        followed = False
        if dom is not None and self._active(dom):
            conn_dom = dom
            flags = libvirt.VIR_DOMAIN_SAVE_RUNNING | (libvirt.VIR_DOMAIN_SAVE_BYPASS_CACHE if bypass_cache else 0)
            if self._is_test(node):
                flags = 0  # libvirt's test driver accepts no save flags
            # Hashed while libvirt writes it (save_hash), on this machine's files and through the
            # page cache only: with BYPASS_CACHE reading it back would fill the cache it bypasses.
            follower = None
            if self.host(node) is None and not bypass_cache:
                partial.unlink(missing_ok=True)  # an earlier failed save's: the follower must see libvirt's new file
                follower = save_hash.FollowingHash(partial)
            try:
                self._call(
                    "save", vm, node, lambda: conn_dom.saveFlags(str(partial), None, flags), on_timeout=dom.abortJob
                )
                transfer.rename(self._ep(partial, node), path, mode=0o600)
                if follower is not None:
                    hashed, followed = follower.finish(path), follower.followed
            finally:
                if follower is not None:
                    follower.abandon()  # after finish: nothing left to stop; after a failure: the reader stops
            transfer.remove(self._ep(partial, node))
            # an older manifest does not describe this file
            transfer.remove(self._ep(integrity.manifest_path(path), node))
        elif not transfer.exists(state_ep):
            if dom is not None and transfer.exists(self._ep(partial, node)) and self._save_image_ok(partial, node):
                transfer.rename(self._ep(partial, node), path)  # the agent died between libvirt's save and the rename
            else:
                raise DriverError("save", vm, node, "the VM is not running and has no saved state")
        disks = self.disk_paths(vm, node) if with_disks else None
        snap = self._describe(vm, node, "memory", path, None, job_id, disks=disks, hashed=hashed)
        self._update_vm(vm, state=VMState.SAVED)
        _log.info("vm saved", vm=vm, node=node, bytes=snap.size_bytes, path=str(path), hashed_while_written=followed)
        return snap

    def _save_image_ok(self, path: Path, node: str) -> bool:
        conn = self.connection(node)
        try:
            conn.saveImageGetXMLDesc(str(path), 0)
        except libvirt.libvirtError:
            return False
        return True

    def restore(
        self, vm: str, node: str, *, from_node: str | None = None, paused: bool = False, bypass_cache: bool = False
    ) -> None:
        """Resume a saved VM on `node`, from its state on `from_node` (default: the same node).

        From another node: the memory state and the overlay are copied over, the copy is
        checked on the destination against what was recorded at save time, and restored there;
        the source's copies and definition are removed only afterwards. A copy that does not
        match is removed from the destination and refused; the source is kept.
        `paused`: the VM comes back paused (a coordinated restore lets all VMs of a job run
        together with `unpause`). `bypass_cache` reads the state with O_DIRECT.
        """
        src = from_node or node
        dom = self._domain(vm, node)
        if dom is not None and self._active(dom):
            if src != node:
                self._drop_source(vm, src, node)
            self._discard_state(vm, node)
            if not paused:
                self.unpause(vm, node)
            return  # already resumed (a repeated call)
        # Hashed once: here before a restore where it was saved, on arrival for a move (the
        # copy's bytes are what QEMU reads; hashing the source first cost a second pass).
        expected = self.verify(vm, src) if src == node else self._expected(vm, src, self.state_path(vm, src), "memory")
        if src != node:
            disks = integrity.recorded_disks(integrity.read_manifest(self.state_path(vm, src), self.host(src)))
            self._ensure_dirs(node)
            self._copy_checked(vm, src, node, expected, disks)
        self._restore_state_file(
            vm, node, self.state_path(vm, node), paused=paused, bypass_cache=bypass_cache, retarget=src != node
        )
        if src != node:
            self._drop_source(vm, src, node)
        self._discard_state(vm, node)
        self._update_vm(vm, node=node, state=VMState.RUNNING, overlay_path=str(self.overlay_path(vm, node)))
        _log.info("vm restored", vm=vm, node=node, source=src)

    def _copy_checked(self, vm: str, src: str, dst: str, expected: Snapshot, disks: dict[str, dict[str, Any]]) -> None:
        """Copy the saved VM from `src` to `dst`. The state copied must be the one recorded at
        save time (size + sha256, hashed on `dst`), and so must its overlay and job disk when
        their digests were recorded (`disks`; checked as soon as they arrive, before the state
        is sent); otherwise the copies are removed there and the restore refused, and the
        source's snapshot stays where it is."""
        state = self.state_path(vm, dst)
        paths, sources = self.disk_paths(vm, dst), self.disk_paths(vm, src)
        try:
            self._copy_between(vm, src, dst, lambda: integrity.check_disks(vm, dst, disks, paths, self.host(dst)))
            integrity.check_against(
                vm, dst, state, {"size_bytes": expected.size_bytes, "sha256": expected.sha256}, self.host(dst)
            )
        except SnapshotError as exc:
            transfer.remove(self._ep(state, dst))
            transfer.remove(self._ep(integrity.manifest_path(state), dst))
            for role, path in paths.items():  # a disk both nodes share is the source's own: kept
                if not transfer.same_file(self._ep(sources[role], src), self._ep(path, dst)):
                    transfer.remove(self._ep(path, dst))
            raise SnapshotError(
                "restore",
                vm,
                dst,
                f"the copy from node {src} does not match the snapshot recorded at save time ({exc}); "
                f"refused and removed from {dst}, the snapshot on {src} is kept",
            ) from None

    def _restore_state_file(
        self,
        vm: str,
        node: str,
        state: Path,
        *,
        paused: bool = False,
        bypass_cache: bool = False,
        retarget: bool = True,
    ) -> None:
        """Start `vm` on `node` from a verified memory state, and keep it defined afterwards
        (a restored transient domain would vanish at its next shutdown).

        `retarget=False` (a state restored on the node that saved it) skips reading the saved
        XML back to rewrite its paths: they are this node's already, and on a busy libvirtd
        that extra call costs up to seconds.
        """
        conn = self.connection(node)
        xml = self._restore_xml(vm, node, state) if retarget else None
        test = self._is_test(node)
        flags = 0  # the test driver takes no flags
        if not test:
            flags |= libvirt.VIR_DOMAIN_SAVE_PAUSED if paused else 0
            flags |= libvirt.VIR_DOMAIN_SAVE_BYPASS_CACHE if bypass_cache else 0
        self._call("restore", vm, node, lambda: conn.restoreFlags(str(state), xml, flags))
        if paused and test:
            self.pause(vm, node)
        restored = self._require_domain("restore", vm, node)
        if not restored.isPersistent():
            inactive = restored.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
            self._call("restore", vm, node, lambda: conn.defineXML(inactive))

    def _restore_xml(self, vm: str, node: str, state: Path) -> str | None:
        """The saved domain XML with this node's overlay and log paths, or None if unchanged."""
        conn = self.connection(node)
        xml = self._call("restore", vm, node, lambda: conn.saveImageGetXMLDesc(str(state), 0))
        return domxml.retarget(
            xml,
            overlay=self.overlay_path(vm, node),
            console_log=self.console_log(vm, node),
            job_disk=self.job_disk_path(vm, node),
            output_logs=self.output_logs(vm, node),
        )

    def _copy_between(self, vm: str, src: str, dst: str, disks_arrived: Callable[[], None]) -> None:
        """Overlay and job disk, then (after `disks_arrived`, which may refuse them) the state."""
        method = self.config.copy_method
        timeout = self.config.operation_timeout_s
        state_src, state_dst = self.state_path(vm, src), self.state_path(vm, dst)
        transfer.copy(
            Endpoint(self.overlay_path(vm, src), self.host(src)),
            Endpoint(self.overlay_path(vm, dst), self.host(dst)),
            method=method,
            timeout_s=timeout,
        )
        self._own_overlay(vm, dst)
        job_src = Endpoint(self.job_disk_path(vm, src), self.host(src))
        if transfer.exists(job_src):
            job_dst = self.job_disk_path(vm, dst)
            transfer.copy(job_src, Endpoint(job_dst, self.host(dst)), method=method, timeout_s=timeout)
            self._own_overlay(vm, dst, job_dst)
        disks_arrived()
        transfer.copy(
            Endpoint(integrity.manifest_path(state_src), self.host(src)),
            Endpoint(integrity.manifest_path(state_dst), self.host(dst)),
            method=method,
            timeout_s=timeout,
        )
        transfer.copy(
            Endpoint(state_src, self.host(src)), Endpoint(state_dst, self.host(dst)), method=method, timeout_s=timeout
        )

    def _drop_source(self, vm: str, src: str, dst: str) -> None:
        """After a resume elsewhere: the source forgets the VM (definition, overlay, state)."""
        dom = self._domain(vm, src)
        if dom is not None and not self._active(dom) and dom.isPersistent():
            self._call("cleanup", vm, src, lambda: dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE))
        host_src, host_dst = self.host(src), self.host(dst)
        overlay_src = Endpoint(self.overlay_path(vm, src), host_src)
        if not transfer.same_file(overlay_src, Endpoint(self.overlay_path(vm, dst), host_dst)):
            transfer.remove(overlay_src)
            transfer.remove(Endpoint(self.job_disk_path(vm, src), host_src))
        state_src = Endpoint(self.state_path(vm, src), host_src)
        if not transfer.same_file(state_src, Endpoint(self.state_path(vm, dst), host_dst)):
            self._forget_snapshot(state_src.path, src)
            transfer.remove(state_src)
            transfer.remove(Endpoint(integrity.manifest_path(state_src.path), host_src))

    def _discard_state(self, vm: str, node: str) -> None:
        """A memory state is stale once the VM runs again: restoring it later would pair it
        with a newer overlay and corrupt the guest's disk, so it is removed."""
        path = self.state_path(vm, node)
        self._forget_snapshot(path, node)
        transfer.remove(Endpoint(path, self.host(node)))
        transfer.remove(Endpoint(integrity.manifest_path(path), self.host(node)))

    # -- migrate ---------------------------------------------------------------------------
    def migrate(self, vm: str, src: str, dst: str, *, live: bool | None = None) -> bool:
        """Migrate a running VM; both nodes must see its overlay at the same path. Returns
        whether the copy was live.

        Live (the guest runs while its memory is copied) on KVM; paused for the whole copy (it
        runs again on `dst`) under QEMU's emulator, TCG, unless `live` says otherwise. Why: on
        QEMU 7.2 a TCG guest that writes its memory fast came out of a live migration with
        memory corrupted — its kernel crashed right after — in 14 of 28 runs at load 2–15 (a
        swapping guest, and a guest only rewriting a file in RAM, no swap, no balloon), and in
        none of 109 paused (docs/remap.md, "The migration defect"). The pause lasts as long as
        the copy (seconds for a few hundred MiB)."""
        if src == dst:
            raise InputError(f"migrate VM {vm}: source and destination are both {src}")
        dst_dom = self._domain(vm, dst)
        if dst_dom is not None and self._active(dst_dom):
            src_dom = self._domain(vm, src)
            if src_dom is not None and not self._active(src_dom) and src_dom.isPersistent():
                self._call("migrate", vm, src, src_dom.undefine)
            return False  # already there
        if self.overlay_path(vm, src) != self.overlay_path(vm, dst):
            raise DriverError(
                "migrate",
                vm,
                src,
                f"live migration needs the overlay at one path on both nodes ({self.overlay_path(vm, src)} vs "
                f"{self.overlay_path(vm, dst)}): use a shared vm_dir, or suspend and resume on {dst}",
            )
        dom = self._require_domain("migrate", vm, src)
        if not self._active(dom):
            raise DriverError("migrate", vm, src, "the VM is not running (resume it instead)")
        dconn = self.connection(dst)
        if live is None:
            live = self._call("migrate", vm, src, lambda: domxml.domain_type(dom.XMLDesc(0))) != "qemu"
        flags = (
            (libvirt.VIR_MIGRATE_LIVE if live else 0)
            | libvirt.VIR_MIGRATE_PERSIST_DEST
            | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
            | libvirt.VIR_MIGRATE_UNSAFE
        )
        uri = self.config.migrate_uris.get(dst)
        self._call("migrate", vm, src, lambda: dom.migrate(dconn, flags, None, uri, 0), on_timeout=dom.abortJob)
        self._update_vm(vm, node=dst, state=VMState.RUNNING)
        _log.info("vm migrated", vm=vm, source=src, destination=dst, live=live)
        return live

    # -- memory ----------------------------------------------------------------------------
    def memory(self, vm: str, node: str) -> tuple[int, int]:
        """(current, maximum) MiB of a running VM: its balloon target and the domain's `<memory>`,
        which the balloon cannot exceed."""
        dom = self._require_domain("memory", vm, node)
        info = self._call("memory", vm, node, dom.info)
        return int(info[2]) // 1024, int(info[1]) // 1024

    def set_memory(self, vm: str, node: str, mib: int) -> None:
        """Set a running VM's balloon target (live only: a node kind's memory belongs to the node
        it runs on, not to its definition). Above the domain's maximum is an error naming both."""
        dom = self._require_domain("set memory", vm, node)
        if not self._active(dom):
            raise DriverError("set memory", vm, node, "the VM is not running")
        most = int(self._call("set memory", vm, node, dom.maxMemory)) // 1024
        if not 16 <= mib <= most:
            raise DriverError("set memory", vm, node, f"{mib} MiB: must be 16..{most} (the domain's maximum)")
        self._call("set memory", vm, node, lambda: dom.setMemoryFlags(mib * 1024, libvirt.VIR_DOMAIN_AFFECT_LIVE))
        _log.info("vm memory set", vm=vm, node=node, mib=mib, max_mib=most)

    # -- snapshot --------------------------------------------------------------------------
    def snapshot(
        self, vm: str, node: str, *, label: str, job_id: int | None = None, keep_running: bool = True
    ) -> Snapshot:
        """A consistent memory + overlay snapshot of a running VM, named `label`.

        With `keep_running` the VM runs on after a pause of one save and one restore; without
        it the VM stays stopped at the snapshot (an RMS's checkpoint signal before a kill: work
        done after the snapshot would be lost anyway).

        Why save → copy → restore rather than libvirt's external snapshots: libvirt 9.0 cannot
        revert external snapshots, and the pair (memory, overlay copy) taken while the VM is
        stopped is consistent and can be restored on any node holding the OS image.
        """
        check_name("snapshot label", label)
        self._ensure_dirs(node)
        snap_dir = self.snapshot_dir(node)
        memory = snap_dir / f"{vm}@{label}{STATE_SUFFIX}"
        overlay_copy = snap_dir / f"{vm}@{label}{OVERLAY_COPY_SUFFIX}"
        if memory.exists() and integrity.manifest_path(memory).exists():
            return self._describe(vm, node, "full", memory, overlay_copy, job_id)
        state = self.state_path(vm, node)
        saved = self.save(vm, node, with_disks=False)
        try:
            transfer.copy(Endpoint(self.overlay_path(vm, node)), Endpoint(overlay_copy), method="local")
            os.replace(state, memory)
            integrity.manifest_path(state).unlink(missing_ok=True)
            self._forget_snapshot(state, node)
            if keep_running:
                conn = self.connection(node)
                self._call("snapshot", vm, node, lambda: conn.restore(str(memory)))
                # The running VM is now ahead of `memory`; libvirt keeps no reference to it.
        except BaseException:
            if not state.exists() and memory.exists() and self.state(vm, node) != VMState.RUNNING:
                os.replace(memory, state)  # keep the VM resumable from its normal state file
            raise
        self._update_vm(vm, state=VMState.RUNNING if keep_running else VMState.STOPPED)
        # `memory` is the saved state renamed (one file, only read since): its save-time digest
        # describes it, no second pass (Saline's periodic snapshots)
        snap = self._describe(vm, node, "full", memory, overlay_copy, job_id, hashed=(saved.size_bytes, saved.sha256))
        _log.info("vm snapshot", vm=vm, node=node, label=label, bytes=snap.size_bytes, running=keep_running)
        return snap

    def restore_snapshot(
        self, vm: str, node: str, *, label: str, from_node: str | None = None, paused: bool = False
    ) -> None:
        """Start the VM on `node` from snapshot `label` (taken on `from_node`), e.g. after the
        RMS killed its job; whatever the VM did since the snapshot is lost, as intended.
        `paused`: it comes back paused (a coordinated restore lets a job's VMs run together)."""
        src = from_node or node
        memory_src = self.snapshot_dir(src) / f"{vm}@{label}{STATE_SUFFIX}"
        overlay_src = self.snapshot_dir(src) / f"{vm}@{label}{OVERLAY_COPY_SUFFIX}"
        expected = self._verify_file(vm, src, memory_src, kind="full")  # before the running VM is stopped
        self.stop(vm, node)
        self._ensure_dirs(node)
        timeout = self.config.operation_timeout_s
        method = self.config.copy_method
        transfer.copy(
            Endpoint(overlay_src, self.host(src)),
            Endpoint(self.overlay_path(vm, node), self.host(node)),
            method=method,
            timeout_s=timeout,
        )
        self._own_overlay(vm, node)
        state = self.state_path(vm, node)
        transfer.copy(
            Endpoint(memory_src, self.host(src)), Endpoint(state, self.host(node)), method=method, timeout_s=timeout
        )
        if src != node or memory_src != state:
            recorded = {"size_bytes": expected.size_bytes, "sha256": expected.sha256}
            integrity.check_against(vm, node, state, recorded, self.host(node))
        self._restore_state_file(vm, node, state, paused=paused)
        transfer.remove(Endpoint(state, self.host(node)))
        self._update_vm(vm, node=node, state=VMState.RUNNING)

    # -- checks and records ----------------------------------------------------------------
    def verify(self, vm: str, node: str) -> Snapshot:
        """Check the saved memory state of `vm` on `node` before it is restored."""
        return self._verify_file(vm, node, self.state_path(vm, node), kind="memory")

    def _verify_file(self, vm: str, node: str, path: Path, *, kind: str) -> Snapshot:
        snap = self._expected(vm, node, path, kind)
        integrity.check_against(vm, node, path, {"size_bytes": snap.size_bytes, "sha256": snap.sha256}, self.host(node))
        return snap

    def _expected(self, vm: str, node: str, path: Path, kind: str) -> Snapshot:
        """What the state `path` on `node` must be (store row, else manifest), without hashing it:
        a state about to be copied is hashed where it arrives (`integrity.check_against`)."""
        host = self.host(node)
        record = self._snapshot_record(path, node)
        expected = record or integrity.read_manifest(path, host)
        if not transfer.exists(Endpoint(path, host)):
            raise SnapshotError("restore", vm, node, f"snapshot {Endpoint(path, host).spec()} is missing")
        if expected is None:
            raise SnapshotError("restore", vm, node, f"snapshot {path} has no manifest and no store record")
        if "size_bytes" not in expected or "sha256" not in expected:
            raise SnapshotError(
                "restore", vm, node, f"snapshot {path}: its manifest is unreadable (no size and sha256)"
            )
        return Snapshot(
            vm,
            node,
            kind,
            path,
            None,
            int(expected["size_bytes"]),
            str(expected["sha256"]),
            float(expected.get("created_at", 0.0)),
            record.get("id") if record else None,
        )

    def _describe(
        self,
        vm: str,
        node: str,
        kind: str,
        path: Path,
        overlay: Path | None,
        job_id: int | None,
        *,
        disks: dict[str, Path] | None = None,
        hashed: tuple[int, str] | None = None,
    ) -> Snapshot:
        """Hash a fresh state file (on its node), write its manifest and its store row (once);
        `disks` (role: path) are hashed into the manifest too. `hashed`: the (size, sha256) of
        this very file computed while it was written (save_hash), used when the size agrees."""
        host = self.host(node)
        existing = integrity.read_manifest(path, host)
        actual = transfer.size(Endpoint(path, host))
        if actual is None:
            raise SnapshotError("save", vm, node, f"state {Endpoint(path, host).spec()} vanished after the save")
        if existing is not None and existing.get("size_bytes") == actual:
            size, digest, created = int(existing["size_bytes"]), str(existing["sha256"]), float(existing["created_at"])
        else:
            digest = hashed[1] if hashed is not None and hashed[0] == actual else transfer.sha256(Endpoint(path, host))
            size, created = actual, now()
            integrity.write_manifest(
                path,
                {
                    "vm": vm,
                    "node": node,
                    "kind": kind,
                    "size_bytes": size,
                    "sha256": digest,
                    "created_at": created,
                    "overlay": str(overlay) if overlay else None,
                    integrity.DISKS: integrity.disk_digests(disks, host) if disks else {},
                },
                host,
            )
        record_id = self._record_snapshot(vm, node, kind, path, size, digest, created, job_id)
        return Snapshot(vm, node, kind, path, overlay, size, digest, created, record_id)

    def _record_snapshot(
        self, vm: str, node: str, kind: str, path: Path, size: int, digest: str, created: float, job_id: int | None
    ) -> int | None:
        if self.store is None:
            return None
        with self.store.session() as s:
            rec = s.scalar(
                select(SnapshotRecord).where(SnapshotRecord.path == str(path), SnapshotRecord.location == node)
            )
            if rec is not None and rec.sha256 == digest:
                return rec.id
            if job_id is None:
                vm_rec = s.scalar(select(VMRecord).where(VMRecord.name == vm))
                job_id = vm_rec.job_id if vm_rec is not None else None
            if job_id is None:
                return None
            if rec is None:
                rec = SnapshotRecord(job_id=job_id, vm_name=vm, path=str(path), location_kind="node")
                s.add(rec)
            rec.kind, rec.size_bytes, rec.sha256, rec.location, rec.created_at = kind, size, digest, node, created
            s.flush()
            return rec.id

    def _snapshot_record(self, path: Path, node: str) -> dict[str, Any] | None:
        """The store row of the state `path` on `node`: nodes without a shared filesystem use
        the same paths, so a path alone does not name one file."""
        if self.store is None:
            return None
        with self.store.session() as s:
            rec = s.scalar(
                select(SnapshotRecord)
                .where(SnapshotRecord.path == str(path), SnapshotRecord.location == node)
                .order_by(SnapshotRecord.id.desc())
            )
            if rec is None:
                return None
            return {"id": rec.id, "size_bytes": rec.size_bytes, "sha256": rec.sha256, "created_at": rec.created_at}

    def _forget_snapshot(self, path: Path, node: str) -> None:
        if self.store is None:
            return
        with self.store.session() as s:
            query = select(SnapshotRecord).where(SnapshotRecord.path == str(path), SnapshotRecord.location == node)
            for rec in s.scalars(query):
                s.delete(rec)

    def _record_vm(self, spec: VMSpec, node: str, job_id: int | None, overlay: Path) -> None:
        if self.store is None or job_id is None:
            return
        with self.store.session() as s:
            rec = s.scalar(select(VMRecord).where(VMRecord.name == spec.name))
            t = now()
            if rec is None:
                rec = VMRecord(name=spec.name, job_id=job_id, image=str(spec.image), created_at=t)
                s.add(rec)
            rec.node, rec.vcpus, rec.memory_mb = node, spec.vcpus, spec.memory_mib
            rec.overlay_path, rec.state, rec.updated_at = str(overlay), VMState.DEFINED.value, t

    def _update_vm(self, vm: str, **fields: Any) -> None:
        if self.store is None:
            return
        with self.store.session() as s:
            rec = s.scalar(select(VMRecord).where(VMRecord.name == vm))
            if rec is None:
                return
            for key, value in fields.items():
                setattr(rec, key, value.value if isinstance(value, VMState) else value)
            rec.updated_at = now()


def _qemu_img(args: list[str], vm: str, timeout_s: float = 120.0) -> str:
    return proc.run(["qemu-img", *args], timeout_s=timeout_s, job=f"VM {vm}")
