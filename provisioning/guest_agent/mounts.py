"""The site's filesystems in the guest: job.json's `mounts`, checked, then mounted over NFSv4
from the job's gateway on the node before the job starts.

Why the guest mounts them itself (and not the node): the guest is the NFS client (its own
kernel; the node may have none), and the server it reaches is the node's per-job NFS gateway
(provisioning.node_service.nfs_ops) at the job network's gateway address, the same address on
every node, so a guest resumed elsewhere finds its server where it left it. The gateway squashes
every uid to the job's: the guest's root (the user's) gains nothing by claiming another uid.

The job must not start without its filesystems: a server not answering yet (the gateway still
starting, a resumed node's gateway in its grace period) is retried until `wait_s`, then the
agent stops with a message naming the export, the server and the last error.

Standard library only (installed under /usr/lib/vjob-guest, imported by the agent).
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_MOUNTS = 16
EXPORT_RE = re.compile(r"/[A-Za-z0-9._-]{1,64}(?:/[A-Za-z0-9._-]{1,64}){0,7}")
PATH_RE = re.compile(r"(?:/[A-Za-z0-9._+-]{1,255}){1,32}")
OPTION_RE = re.compile(r"[a-z0-9_]{1,32}(?:=[A-Za-z0-9._-]{1,64})?")
MAX_OPTIONS = 16
RESERVED_OPTIONS = frozenset("vers nfsvers port addr clientaddr proto sec mountport nfs retry".split())
"""Options the agent sets itself (protocol, server, port, security): not from the list."""
FORBIDDEN_TARGETS = tuple("/proc /sys /dev /etc /usr /bin /sbin /lib /lib64 /boot /vjob /run".split())
"""A site filesystem never hides what the guest runs on (the same list as a working directory)."""
WAIT_S = 300
MAX_WAIT_S = 86400
RETRY_S = 2.0
MOUNT_TIMEOUT_S = 60.0
JOB_STDERR = "/dev/ttyS2"
"""The job's stderr port (the agent's STDERR_TTY)."""
BASE_OPTIONS = ("vers=4.2", "proto=tcp", "hard", "timeo=100", "retrans=3", "retry=0")
"""NFSv4.2 only (the gateway speaks nothing else); `hard`: a server away (a node's gateway
restarting, a guest resumed before its gateway is up) blocks the job's I/O and retries it, it
never turns into an error or a lost write. `retry=0`: mount.nfs tries once, this module retries."""


class MountError(Exception):
    """job.json's `mounts` is unusable, or a filesystem could not be mounted: the message says which."""


@dataclass(frozen=True)
class Export:
    export: str
    """The gateway's pseudo path (NFSv4 pseudo filesystem), e.g. "/vjob/0"."""
    target: str
    """Where it appears in the guest, e.g. "/home"."""
    options: tuple[str, ...]


@dataclass(frozen=True)
class SiteMounts:
    server: str
    port: int
    exports: tuple[Export, ...]
    wait_s: int = WAIT_S


def _int(field: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise MountError(f"{field}: {str(value)[:40]!r}: must be an integer in {low}..{high}")
    return value


def check_target(value: object) -> str:
    """An absolute, normalised path of plain names, not a system directory."""
    if not isinstance(value, str) or not PATH_RE.fullmatch(value) or os.path.normpath(value) != value:
        raise MountError(f"mounts.exports.target: {str(value)[:80]!r}: an absolute path of plain names")
    if any(part in {".", ".."} for part in value.split("/")):
        raise MountError(f"mounts.exports.target: {value[:80]!r}: no '.' or '..'")
    if any(value == p or value.startswith(p + "/") for p in FORBIDDEN_TARGETS):
        raise MountError(f"mounts.exports.target: {value[:80]!r}: a system directory")
    return value


def check_options(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_OPTIONS:
        raise MountError(f"mounts.exports.options: must be a list of at most {MAX_OPTIONS} options")
    for opt in value:
        if not isinstance(opt, str) or not OPTION_RE.fullmatch(opt):
            raise MountError(f"mounts.exports.options: {str(opt)[:80]!r}: name or name=value of letters, digits, . _ -")
        if opt.split("=", 1)[0] in RESERVED_OPTIONS:
            raise MountError(f"mounts.exports.options: {opt!r}: set by the agent, not by the list")
    return tuple(value)


def parse_export(item: object) -> Export:
    if not isinstance(item, dict) or set(item) - {"export", "target", "options"}:
        raise MountError(f"mounts.exports: {str(item)[:80]!r}: an object of export, target, options")
    export = item.get("export")
    if not isinstance(export, str) or not EXPORT_RE.fullmatch(export) or ".." in export.split("/"):
        raise MountError(f"mounts.exports.export: {str(export)[:80]!r}: must match {EXPORT_RE.pattern}")
    return Export(export, check_target(item.get("target")), check_options(item.get("options", [])))


def parse_mounts(data: object) -> SiteMounts | None:
    """job.json's `mounts` (None when absent), every field checked: it reaches the mount table."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise MountError("mounts: must be an object")
    try:
        server = str(ipaddress.IPv4Address(data.get("server") if isinstance(data.get("server"), str) else ""))
    except ValueError:
        raise MountError(f"mounts.server: {str(data.get('server'))[:40]!r}: must be an IPv4 address") from None
    port = _int("mounts.port", data.get("port"), 1, 65535)
    wait_s = _int("mounts.wait_s", data.get("wait_s", WAIT_S), 1, MAX_WAIT_S)
    raw = data.get("exports")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_MOUNTS:
        raise MountError(f"mounts.exports: must be a list of 1..{MAX_MOUNTS} exports")
    exports = tuple(parse_export(item) for item in raw)
    targets = [e.target for e in exports]
    if len(set(targets)) != len(targets):
        raise MountError(f"mounts.exports: a target appears twice: {targets}")
    return SiteMounts(server, port, exports, wait_s)


def covers(site: SiteMounts | None, path: str) -> bool:
    """Whether `path` is on one of the site's filesystems (then the job works there in place)."""
    if site is None:
        return False
    return any(path == e.target or path.startswith(e.target.rstrip("/") + "/") for e in site.exports)


def mount_command(site: SiteMounts, export: Export) -> list[str]:
    options = ",".join([*BASE_OPTIONS, f"port={site.port}", *export.options])
    return ["mount", "-t", "nfs4", "-o", options, f"{site.server}:{export.export}", export.target]


Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S, check=False
    )


def mount_all(
    site: SiteMounts,
    *,
    run: Runner = _run,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] = print,
) -> None:
    """Mount every export (parents first), retrying each until `site.wait_s` has passed."""
    try:
        run(["modprobe", "nfsv4"])  # the kernel would ask for it too, when its modprobe helper works
    except (OSError, subprocess.SubprocessError):
        pass
    deadline = clock() + site.wait_s
    for export in sorted(site.exports, key=lambda e: e.target.count("/")):
        os.makedirs(export.target, mode=0o755, exist_ok=True)
        cmd, tries = mount_command(site, export), 0
        while True:
            tries += 1
            try:
                done = run(cmd)
                ok, why = done.returncode == 0, (done.stderr or done.stdout or "").strip()[-300:]
            except (OSError, subprocess.SubprocessError) as exc:
                ok, why = False, str(exc)[-300:]
            if ok:
                say(f"VJOB-GUEST: mounted {site.server}:{export.export} on {export.target} (try {tries})")
                break
            if tries == 1:
                say(f"VJOB-GUEST: {site.server}:{export.export} not mounted yet ({why[-120:]}): retrying")
            if clock() >= deadline:
                error = MountError(
                    f"mounts: {site.server}:{export.export} (port {site.port}) on {export.target}: not mounted "
                    f"after {site.wait_s} s and {tries} tries; last error: {why or 'none given'}"
                )
                tell_job(f"vjob: the job was not started: {error}")
                raise error
            sleep(RETRY_S)


def tell_job(text: str) -> None:
    """One line on the job's stderr (the serial port the pilot copies into the job's error
    output): a job that never starts says why where its user looks, not only on the console."""
    try:
        fd = os.open(JOB_STDERR, os.O_WRONLY | os.O_NOCTTY)
    except OSError:
        return
    try:
        os.write(fd, (text + "\n").encode(errors="replace"))
    except OSError:
        pass
    finally:
        os.close(fd)
