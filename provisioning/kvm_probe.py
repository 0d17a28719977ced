"""`domain_type = "auto"`: KVM only where a probe boot proved that it runs a guest.

Why a probe and not the device file: on the machines of this project `/dev/kvm` exists (a
PVM module) and QEMU starts with `-accel kvm`, but a stock Debian kernel hangs right after
"Probing EDD" with a named CPU model, and `-cpu host` aborts (notes/libvirt.md, pitfall 19).
So the answer comes from booting the tiny counter guest (provisioning.guest) under KVM with
the CPU model real VMs get, and waiting for its first `COUNTER` line. The verdict is cached
per host (kernel release, QEMU binary, CPU model) in the vjob cache: the probe costs one boot
(or its timeout, 20 s) once per host.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from provisioning import guest, safe_dirs
from vjob import log

EMULATOR = Path("/usr/bin/qemu-system-x86_64")
PROBE_TIMEOUT_S = 20.0
_log = log.get("provisioning")


def host_key(cpu_model: str) -> str:
    """What the verdict depends on: the host kernel, the QEMU binary and the CPU model."""
    try:
        st = EMULATOR.stat()
        qemu = f"{st.st_size}:{int(st.st_mtime)}"
    except OSError:
        qemu = "none"
    return f"{os.uname().release}|{qemu}|{cpu_model}"


def cache_file() -> Path:
    return guest.cache_dir() / "kvm-probe.json"


def cached(cpu_model: str, path: Path | None = None) -> str | None:
    """The cached verdict ("kvm" or "qemu") for this host, None when there is none."""
    path = path or cache_file()
    try:
        safe_dirs.check_owned(path, directory=False)
        data = json.loads(path.read_text())
    except (OSError, ValueError, safe_dirs.UnsafePathError):
        return None
    if not isinstance(data, dict) or data.get("key") != host_key(cpu_model):
        return None
    verdict = data.get("domain_type")
    return verdict if verdict in ("kvm", "qemu") else None


def remember(cpu_model: str, verdict: str, took_s: float, path: Path | None = None) -> None:
    path = path or cache_file()
    safe_dirs.ensure_dir(path.parent, 0o755)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(
        json.dumps({"key": host_key(cpu_model), "domain_type": verdict, "probe_s": round(took_s, 2), "at": time.time()})
    )
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def kvm_usable() -> bool:
    """The device exists and this process may open it (a user's QEMU needs that too)."""
    return os.access("/dev/kvm", os.R_OK | os.W_OK)


def saw_counter(console_log: Path) -> bool:
    try:
        return b"COUNTER 1" in console_log.read_bytes()
    except OSError:
        return False
