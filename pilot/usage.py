"""The VMs' usage of each run of the pilot, measured by root and written into the job's RMS record.

Why the pilot says when, but never how much: QEMU runs outside the job's step, so the RMS does
not count it (docs/multinode.md "Accounting"), and a figure the job's user sent would be that
user's word. The pilot only marks a run's start (its VMs are about to boot, be restored or be
adopted) and its end; who measures depends on who the pilot is:

* an ordinary user's pilot asks the node service (`[node] socket`), which samples the kernel's
  counters of the job's QEMU processes as root and writes the record (usage.start /
  usage.final, provisioning.node_service.usage_ops);
* a pilot running as root measures the same way itself (provisioning.vm_usage: the QEMU of
  root's libvirt runs as root or libvirt-qemu, named by root) and writes through the RMS's
  writer (plugins.usage_writers) — only its own node's VMs: a multi-node job's other nodes are
  measured there by the node service;
* anything else (no service configured, not inside an RMS job — a test's in-process pilot)
  measures nothing.

Never fatal: a run's usage that cannot be measured or written is logged; the job goes on.
"""

from __future__ import annotations

import os
import pwd
import threading
from collections.abc import Mapping
from typing import Protocol

from pilot.settings import PilotSettings
from plugins import job_environment
from plugins.usage_writers import usage_writer
from provisioning.node_service.client import NodeClient
from provisioning.node_service.usage_ops import SYSTEM_QEMU_USERS, UsageWriter
from provisioning.vm_usage import JobMeter
from vjob import log
from vjob.config import load
from vjob.errors import VjobError
from vjob.pilot_files.names import member_names, vm_name

DEFAULT_INTERVAL_S = 30.0


class RunUsage(Protocol):
    """What the pilot calls: a run's start (idempotent), a sample when its VMs have just
    started or are about to be saved (a run shorter than the sampling interval is then still
    counted: the QEMU processes are seen alive at both ends), and its end."""

    def start(self) -> None: ...

    def sample(self) -> None: ...

    def final(self) -> None: ...


class NoUsage:
    """Nothing is measured (no service, not in a job)."""

    def start(self) -> None:
        return None

    def sample(self) -> None:
        return None

    def final(self) -> None:
        return None


class ServiceUsage:
    """An ordinary user's pilot: the node service measures and writes."""

    def __init__(self, socket_path: str, settings: PilotSettings) -> None:
        self.client = NodeClient(socket_path, timeout=90.0)
        self.s = settings
        self.log = log.get("pilot").bind(job=settings.job_id, node=settings.node)

    def start(self) -> None:
        self._call("usage.start")

    def sample(self) -> None:
        self._call("usage.start")  # idempotent: the service samples the job's VMs now

    def final(self) -> None:
        answer = self._call("usage.final")
        if answer is not None and not answer.get("written", False):
            self.log.warning("the VMs' usage was not written", error=str(answer.get("reason", ""))[:300])

    def _call(self, op: str) -> dict[str, object] | None:
        try:
            return self.client.call(op, job=self.s.job_id, node=self.s.node)
        except (VjobError, OSError) as exc:
            self.log.warning("node service: usage not measured", op=op, error=str(exc)[:300])
            return None


class LocalUsage:
    """A root pilot: samples its node's QEMU processes itself and writes through the RMS."""

    def __init__(self, settings: PilotSettings, vm_count: int, writer: UsageWriter, interval_s: float) -> None:
        uids = {0, os.getuid()}
        for name in SYSTEM_QEMU_USERS:
            uids |= _uid_of(name)
        base = vm_name(settings.rms, settings.job_id)
        self.meter = JobMeter(frozenset(uids), frozenset({base, *member_names(base, max(vm_count, 1))}))
        self.writer = writer
        self.s = settings
        self.interval_s = interval_s
        self.log = log.get("pilot").bind(job=settings.job_id, node=settings.node)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            self._sample()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="vm-usage", daemon=True)
                self._thread.start()

    def sample(self) -> None:
        with self._lock:
            self._sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                self._sample()

    def _sample(self) -> None:
        try:
            self.meter.sample()
        except OSError as exc:  # /proc unreadable: this sample is lost, the run goes on
            self.log.warning("VM usage sample failed", error=str(exc)[:200])

    def final(self) -> None:
        self._stop.set()
        with self._lock:
            self._sample()
            measured = self.meter.processes_seen > 0
            run = self.meter.take()
        if not measured:
            self.log.info("no VM of the job seen on this node: no usage written")
            return
        try:
            self.writer.add(self.s.job_id, self.s.node, run)
            self.log.info("VM usage written", cpu_s=run.cpu_s, peak_mib=run.peak_mib)
        except (VjobError, OSError) as exc:
            self.log.warning("the VMs' usage was not written", error=str(exc)[:300])


def _uid_of(name: str) -> set[int]:
    try:
        return {pwd.getpwnam(name).pw_uid}
    except KeyError:
        return set()


def for_pilot(settings: PilotSettings, vm_count: int, env: Mapping[str, str] | None = None) -> RunUsage:
    """Who measures this pilot's runs (see the module's docstring)."""
    environ = os.environ if env is None else env
    try:
        if job_environment(settings.rms).job_id_from(environ) != settings.job_id:
            return NoUsage()  # not the RMS's job (a test's pilot, `vjob run --job-id` by hand)
        cfg = load()
        if os.geteuid() == 0:
            writer = usage_writer(settings.rms, cfg)
            return NoUsage() if writer is None else LocalUsage(settings, vm_count, writer, cfg.node.usage_interval_s)
        if cfg.node.socket:
            return ServiceUsage(cfg.node.socket, settings)
    except VjobError as exc:
        log.get("pilot").warning("VM usage not measured", error=str(exc)[:300])
    return NoUsage()
