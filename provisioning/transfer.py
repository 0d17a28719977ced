"""Copying files between nodes: local copy, rsync or scp, chosen by configuration.

Why pluggable: on one machine (and in tests) every node sees the same filesystem and a local
copy is the physical limit; on a cluster, memory states, overlays and OS images travel over
ssh. All three write to a temporary name first and rename at the end, so a copy cut in half
never looks complete, and keep owner-only permissions on what holds users' memory.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from provisioning import safe_dirs
from vjob import log, proc
from vjob.errors import InputError, VjobError

_log = log.get("provisioning")

SSH_CONFIG_ENV = "VJOB_SSH_CONFIG"
"""An ssh client configuration file for node-to-node copies (`ssh -F`); unset: ssh's own.
Why an environment variable: the ssh options of a site (ports, keys, jump hosts) belong in an
ssh config file, and the test harness's second host needs a private one without touching
root's ~/.ssh."""
COPY_ATTEMPTS = 3
"""How many times a remote copy is tried: rsync keeps the part already sent (`--partial`), so a
transfer killed half-way resumes where it stopped."""
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_SIZE_RE = re.compile(r"[0-9]{1,20}")
MANIFEST_LIMIT = 64 << 10
"""Largest manifest read from a node (bytes): a manifest is a few hundred bytes of JSON."""

SHARE_CONNECTIONS = True
"""Share one ssh connection per (host, user, port) between the remote operations (OpenSSH
ControlMaster). Why: a resume on another host is about fifteen ssh calls, and each new
connection pays a key exchange (about a second on a loaded node); through a master they cost
milliseconds. False: every call opens its own connection, as before (the bench's "before")."""
CONTROL_DIR = Path("/run/vjob/ssh")
"""Where root's control sockets live: a directory only root owns and can write, never /tmp
itself (anyone could plant a socket there, or take the name first)."""
CONTROL_PERSIST_S = 60
"""How long an idle master stays (ssh's ControlPersist): it ends by itself when the process
that started it died without closing it (`close_connections`)."""
SOCKET_PATH_MAX = 107
"""Longest UNIX socket path (sun_path is 108 bytes with its final NUL)."""
_CONTROL_NAME_LEN = 1 + 40 + 17
"""What ssh appends to the control directory: "/", %C (40 hex digits of a SHA-1) and, while
it creates the socket, a ".<16 random characters>" temporary name."""
_shared: set[tuple[str, tuple[str, ...]]] = set()
"""(host, ssh options) of the masters this process may have started: closed by `close_connections`."""
_shared_lock = threading.Lock()
_warned: set[str] = set()

Method = Literal["local", "rsync", "scp"]
METHODS: tuple[str, ...] = ("local", "rsync", "scp")


@dataclass(frozen=True)
class Endpoint:
    """A file on a node: `host` None means this machine."""

    path: Path
    host: str | None = None

    def spec(self) -> str:
        return str(self.path) if self.host is None else f"{self.host}:{self.path}"


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise InputError(f"copy method {method!r}: must be one of {', '.join(METHODS)}")


def same_file(src: Endpoint, dst: Endpoint) -> bool:
    """True when both ends name one file (nodes sharing a filesystem): nothing to copy."""
    if src.host != dst.host:
        return False
    if src.host is None:
        try:
            return src.path.resolve() == dst.path.resolve()
        except OSError:
            return False
    return src.path == dst.path


def copy(
    src: Endpoint,
    dst: Endpoint,
    *,
    method: str = "local",
    mode: int = 0o600,
    timeout_s: float = 600.0,
    attempts: int = COPY_ATTEMPTS,
) -> None:
    """Copy `src` to `dst` with `method`; the destination gets `mode` (0600 by default).

    A remote copy that fails (a killed rsync, a dropped connection) is tried again up to
    `attempts` times; the destination name appears only once a copy completed.
    """
    _check_method(method)
    if same_file(src, dst):
        return
    if method == "local" or (src.host is None and dst.host is None):
        _copy_local(src.path, dst.path, mode)
        return
    if src.host is not None and src.host == dst.host:  # both on one other host: rsync cannot, cp there
        _copy_on(src.host, src.path, dst.path, mode, timeout_s)
        return
    tmp = Endpoint(dst.path.with_name(f".{dst.path.name}.part"), dst.host)
    if method == "rsync":
        cmd = [
            "rsync",
            "--partial",
            "--inplace",
            f"--chmod=F{mode:o}",
            "-t",
            "-e",
            _rsync_shell(src.host or dst.host),
            src.spec(),
            tmp.spec(),
        ]
    else:
        cmd = [
            "scp",
            "-q",
            "-B",
            "-p",
            *_ssh_options(),
            *_control_options(src.host, dst.host),
            *(["-3"] if src.host and dst.host else []),
            src.spec(),
            tmp.spec(),
        ]
    for attempt in range(1, max(1, attempts) + 1):
        try:
            _run(cmd, timeout_s)
            break
        except VjobError as exc:
            if attempt >= attempts:
                remove(tmp)
                raise
            _log.warning(
                "copy failed, retrying",
                source=src.spec(),
                destination=dst.spec(),
                attempt=attempt,
                error=str(exc)[:300],
            )
    if dst.host is None:
        os.chmod(tmp.path, mode)
        os.replace(tmp.path, dst.path)
    else:  # one ssh round trip (about a second each on a loaded node): chmod, then rename
        script = 'chmod "$1" -- "$2" && mv -f -- "$2" "$3"'
        run_on(dst.host, ["sh", "-c", script, "sh", f"{mode:o}", str(tmp.path), str(dst.path)], timeout_s=timeout_s)


def copy_into(
    sources: list[Endpoint], directory: Endpoint, *, method: str = "local", mode: int = 0o600, timeout_s: float = 600.0
) -> None:
    """Copy several files of one node into `directory` of another, under their own names, in
    one rsync (or scp) call: one ssh round trip instead of one per file plus its rename.

    For small files that need no resume (a VM's output logs): rsync writes each to a temporary
    name in `directory` and renames it when whole, so a copy cut in half never looks complete;
    a failed call is tried again whole, up to `COPY_ATTEMPTS` times."""
    _check_method(method)
    if not sources:
        return
    hosts = {s.host for s in sources}
    if len(hosts) != 1:
        raise InputError("copy_into: the sources must be on one node")
    src_host = sources[0].host
    remote = src_host is not None or directory.host is not None
    if method == "local" or not remote or src_host == directory.host:
        for s in sources:  # one filesystem, or both on one other host: per file, as `copy` does
            copy(
                s, Endpoint(directory.path / s.path.name, directory.host), method=method, mode=mode, timeout_s=timeout_s
            )
        return
    target = f"{directory.spec()}/"
    if method == "rsync":
        shell = _rsync_shell(src_host or directory.host)
        cmd = ["rsync", f"--chmod=F{mode:o}", "-t", "-e", shell, *(s.spec() for s in sources), target]
    else:
        opts = [*_ssh_options(), *_control_options(src_host, directory.host)]
        cmd = [
            "scp",
            "-q",
            "-B",
            "-p",
            *opts,
            *(["-3"] if src_host and directory.host else []),
            *(s.spec() for s in sources),
            target,
        ]
    for attempt in range(1, COPY_ATTEMPTS + 1):
        try:
            _run(cmd, timeout_s)
            return
        except VjobError as exc:
            if attempt >= COPY_ATTEMPTS:
                raise
            _log.warning("copy failed, retrying", destination=target, attempt=attempt, error=str(exc)[:300])


def _copy_on(host: str, src: Path, dst: Path, mode: int, timeout_s: float) -> None:
    """A copy between two files of one other host (a node's snapshot dir and a repository
    there, a labelled snapshot and a VM's overlay), in one ssh round trip: through a temporary
    name created with `mode` from the start (install), then renamed."""
    tmp = dst.with_name(f".{dst.name}.part")
    script = 'install -m "$1" -- "$2" "$3" && mv -f -- "$3" "$4" || { rm -f -- "$3"; exit 1; }'
    run_on(host, ["sh", "-c", script, "sh", f"{mode:o}", str(src), str(tmp), str(dst)], timeout_s=timeout_s)


def _copy_local(src: Path, dst: Path, mode: int) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
            shutil.copyfileobj(fin, fout, 4 << 20)
        os.chmod(tmp, mode)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove(target: Endpoint, *, timeout_s: float = 60.0) -> None:
    """Delete a file on a node; a file already gone is fine (idempotent)."""
    if target.host is None:
        target.path.unlink(missing_ok=True)
        return
    run_on(target.host, ["rm", "-f", str(target.path)], timeout_s=timeout_s)


def exists(target: Endpoint, *, timeout_s: float = 60.0) -> bool:
    """Whether a file is there on its node (`test -e` over ssh for a remote one)."""
    if target.host is None:
        return target.path.exists()
    try:
        run_on(target.host, ["test", "-e", str(target.path)], timeout_s=timeout_s)
    except VjobError:
        return False
    return True


def _ssh_options() -> list[str]:
    """`-F <file>` when VJOB_SSH_CONFIG names a readable regular file, else nothing."""
    cfg = os.environ.get(SSH_CONFIG_ENV, "")
    if not cfg:
        return []
    if not re.fullmatch(r"/[A-Za-z0-9_./-]{1,4095}", cfg) or not os.path.isfile(cfg):
        raise InputError(f"{SSH_CONFIG_ENV} = {cfg[:200]!r}: must be the absolute path of an ssh config file")
    return ["-F", cfg]


def _rsync_shell(host: str | None) -> str:
    """rsync's `-e`: rsync splits it on spaces, hence the plain-path rule of `_ssh_options`
    (and of the control directory: `_control_options`)."""
    return " ".join(["ssh", "-o", "BatchMode=yes", *_ssh_options(), *_control_options(host)])


def control_dir() -> Path:
    """The directory of this user's control sockets: root's is `CONTROL_DIR`; another user's is
    in their own runtime directory ($XDG_RUNTIME_DIR), else in their ~/.ssh."""
    if os.geteuid() == 0:
        return CONTROL_DIR
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/"):
        return Path(runtime) / "vjob-ssh"
    return Path.home() / ".ssh" / "vjob-control"


def _warn_once(message: str, **fields: object) -> None:
    if message not in _warned:
        _warned.add(message)
        _log.warning(message, **fields)


def _control_options(*hosts: str | None) -> list[str]:
    """ssh's options to share one connection per destination, and remember `hosts` for
    `close_connections`; none (a connection of its own, as before) when sharing is off or the
    control directory cannot be trusted.

    The directory is created and checked before every use (`safe_dirs.ensure_dir`: ours, no
    symlink, nobody else can write it or a directory above it), so nobody else can plant a
    socket where ssh looks for its master. %C (a hash of local host, host, port and user)
    keeps the socket path short whatever the host name. A master that died leaves a socket
    nobody answers: ssh removes it and connects by itself (ControlMaster=auto)."""
    if not SHARE_CONNECTIONS:
        return []
    where = control_dir()
    if len(str(where)) + _CONTROL_NAME_LEN > SOCKET_PATH_MAX or not re.fullmatch(r"/[A-Za-z0-9_./-]+", str(where)):
        _warn_once(
            "ssh connections not shared: the control directory's path is too long for a UNIX socket or "
            "holds characters rsync's -e would split",
            directory=str(where)[:200],
        )
        return []
    try:
        safe_dirs.ensure_dir(where.parent, 0o755)  # /run/vjob: also the home of saline.sock, which users reach
        safe_dirs.ensure_dir(where, 0o700)
    except (OSError, VjobError) as exc:
        _warn_once("ssh connections not shared: the control directory cannot be trusted", error=str(exc)[:300])
        return []
    options = ["-o", "ControlMaster=auto", "-o", f"ControlPath={where}/%C", "-o", f"ControlPersist={CONTROL_PERSIST_S}"]
    with _shared_lock:
        for host in hosts:
            if host is not None:
                _shared.add((host, (*_ssh_options(), *options)))
    return options


def close_connections(*, timeout_s: float = 10.0) -> int:
    """Ask every master this process may have started to stop; returns how many answered.

    `-O stop`, not `-O exit`: the master stops taking new sessions at once (its socket is
    removed, so a new call makes a new master) and ends when the sessions still running in it
    (another thread's copy) are done, instead of cutting them."""
    with _shared_lock:
        shared = sorted(_shared)
        _shared.clear()
    stopped = 0
    for host, options in shared:
        try:
            proc.run(["ssh", "-o", "BatchMode=yes", *options, "-O", "stop", host], timeout_s=timeout_s)
        except VjobError:
            continue  # no master there any more (ControlPersist ended it, or it died): nothing to stop
        stopped += 1
    return stopped


def run_on(host: str, argv: list[str], *, timeout_s: float = 60.0, stdin: str | None = None) -> str:
    """Run a command on `host` over ssh (no password prompt) and return its output.

    ssh hands the remote shell one string: every argument is quoted, so a path with a space
    or a `;` stays one argument and never becomes a command.
    """
    if host.startswith("-"):
        raise InputError(f"ssh host {host[:80]!r}: must not start with '-'")
    remote = " ".join(shlex.quote(a) for a in argv)
    return proc.run(
        ["ssh", "-o", "BatchMode=yes", *_ssh_options(), *_control_options(host), host, "--", remote],
        timeout_s=timeout_s,
        stdin=stdin,
    )


def _run(cmd: list[str], timeout_s: float) -> None:
    proc.run(cmd, timeout_s=timeout_s)


# -- files on a node (this machine when host is None, else over ssh) --------------------------
def size(target: Endpoint, *, timeout_s: float = 60.0) -> int | None:
    """The file's size in bytes, None when it is not there."""
    if target.host is None:
        try:
            return target.path.stat().st_size
        except FileNotFoundError:
            return None
    try:
        out = run_on(target.host, ["stat", "-L", "-c", "%s", "--", str(target.path)], timeout_s=timeout_s).strip()
    except VjobError:
        if not exists(target, timeout_s=timeout_s):
            return None  # asked only when stat failed: one round trip for a file that is there
        raise
    if not _SIZE_RE.fullmatch(out):
        raise VjobError(f"size of {target.spec()}: unexpected answer {out[:80]!r}")
    return int(out)


def size_and_sha256(target: Endpoint, *, timeout_s: float = 600.0) -> tuple[int, str] | None:
    """The file's size and SHA-256, computed where it is (one ssh round trip for a remote one);
    None when it is not there."""
    if target.host is None:
        try:
            n = target.path.stat().st_size
        except FileNotFoundError:
            return None
        return n, sha256_file(target.path)
    script = 'stat -L -c %s -- "$1" && sha256sum -- "$1"'
    try:
        out = run_on(target.host, ["sh", "-c", script, "sh", str(target.path)], timeout_s=timeout_s)
    except VjobError:
        if not exists(target, timeout_s=timeout_s):
            return None
        raise
    lines = out.strip().splitlines()
    digest = lines[1].split(" ", 1)[0].strip() if len(lines) == 2 else ""
    if not _SIZE_RE.fullmatch(lines[0].strip() if lines else "") or not _SHA256_RE.fullmatch(digest):
        raise VjobError(f"size and sha256 of {target.spec()}: unexpected answer {out[:160]!r}")
    return int(lines[0]), digest


def sha256(target: Endpoint, *, timeout_s: float = 600.0) -> str:
    """The SHA-256 of a file, computed where the file is (never through a local path)."""
    if target.host is None:
        return sha256_file(target.path)
    out = run_on(target.host, ["sha256sum", "--", str(target.path)], timeout_s=timeout_s)
    digest = out.split(" ", 1)[0].strip()
    if not _SHA256_RE.fullmatch(digest):
        raise VjobError(f"sha256 of {target.spec()}: unexpected answer {out[:80]!r}")
    return digest


def read_text(target: Endpoint, *, limit: int = MANIFEST_LIMIT, timeout_s: float = 60.0) -> str | None:
    """A small text file's content (None when absent); larger than `limit` is an error."""
    if target.host is None:
        n = size(target, timeout_s=timeout_s)
        if n is None:
            return None
        if n > limit:
            raise InputError(f"file {target.spec()}: {n} bytes, more than the {limit} expected")
        return target.path.read_text(errors="replace")
    # one ssh round trip: "-" for a missing file, else its size, then at most limit + 1 bytes
    script = 'if [ ! -e "$1" ]; then echo -; exit 0; fi; stat -L -c %s -- "$1" && head -c "$2" -- "$1"'
    out = run_on(target.host, ["sh", "-c", script, "sh", str(target.path), str(limit + 1)], timeout_s=timeout_s)
    first, _, text = out.partition("\n")
    if first == "-":
        return None
    if not _SIZE_RE.fullmatch(first):
        raise VjobError(f"size of {target.spec()}: unexpected answer {first[:80]!r}")
    if int(first) > limit or len(text.encode(errors="replace")) > limit:
        raise InputError(f"file {target.spec()}: {first} bytes, more than the {limit} expected")
    return text


def write_text(target: Endpoint, text: str, *, mode: int = 0o600, timeout_s: float = 60.0) -> None:
    """Write a small file atomically (temporary name, then rename) with `mode`."""
    tmp = target.path.with_name(target.path.name + ".part")
    if target.host is None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, target.path)
        return
    # install(1) creates the file with its mode from the start: no moment where others can read
    # it; then renamed, in the same ssh round trip
    script = 'install -m "$1" /dev/stdin "$2" && mv -f -- "$2" "$3"'
    argv = ["sh", "-c", script, "sh", f"{mode:o}", str(tmp), str(target.path)]
    run_on(target.host, argv, timeout_s=timeout_s, stdin=text)


def rename(src: Endpoint, dst_path: Path, *, mode: int | None = None, timeout_s: float = 60.0) -> None:
    """Rename a file on its node (optionally setting its mode first)."""
    if src.host is None:
        if mode is not None:
            os.chmod(src.path, mode)
        os.replace(src.path, dst_path)
        return
    if mode is not None:
        run_on(src.host, ["chmod", f"{mode:o}", "--", str(src.path)], timeout_s=timeout_s)
    run_on(src.host, ["mv", "-f", "--", str(src.path), str(dst_path)], timeout_s=timeout_s)


def ensure_remote_dir(target: Endpoint, mode: int, *, timeout_s: float = 60.0) -> None:
    """Create a directory on a remote node with `mode`, and refuse one someone else can write.

    The remote counterpart of `safe_dirs.ensure_dir` (which checks this machine only): the
    directory must be owned by the ssh user and writable by nobody else.
    """
    assert target.host is not None
    script = 'mkdir -p -m "$2" -- "$1" && stat -c "%u %a %F" -- "$1" && id -u'  # one ssh round trip
    answer = run_on(target.host, ["sh", "-c", script, "sh", str(target.path), f"{mode:o}"], timeout_s=timeout_s)
    lines = answer.strip().splitlines()
    out, uid = (lines[0].split(" "), lines[1].strip()) if len(lines) == 2 else ([], "?")
    if len(out) < 3 or out[0] != uid or out[2].strip() != "directory" or int(out[1], 8) & 0o022:
        # never repaired silently: what others could write there cannot be trusted any more
        raise VjobError(
            f"directory {target.spec()}: must be a directory owned by uid {uid} and writable by nobody "
            f"else (stat says {' '.join(out).strip()[:80]!r}); remove it and try again"
        )
    run_on(target.host, ["chmod", f"{mode:o}", "--", str(target.path)], timeout_s=timeout_s)


def sha256_file(path: Path, *, chunk: int = 4 << 20) -> str:
    """The SHA-256 of a file, read in chunks (memory states are hundreds of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
