"""The manager's Unix socket: how users submit, list, show and cancel best-effort vjobs.

Why a socket and not the store: users used to need the shared store's credentials to run
`vjob besteffort submit`, so anyone could write any row — another user's name in `user`, a
`cancel` of anyone's vjob, a key that the root manager then used as a path. Now only the
site master holds the credentials. A user's command connects to the manager's socket, and
the kernel tells the manager who is calling (SO_PEERCRED: the caller's uid, which the caller
cannot forge). The manager acts for that user only: root may act for anyone, everyone else
only on their own vjobs, and `submit --user` for someone else is refused here, server-side.

The protocol (saline_bew.protocol) is one JSON object per line each way, at most `MAX_LINE`
bytes, validated with pydantic; the users' side is saline_bew.client. The socket file is
`DEFAULT_SOCKET` unless configured; its directory must be root's and not
writable by others (checked with lstat before binding), the socket itself is mode 0666, or
0660 with a group when the site restricts Saline to a group.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import socket
import socketserver
import stat
import struct
import threading
import time
from pathlib import Path
from typing import Any

from saline_bew import grammar, journal, output, staging
from saline_bew.events import EventKind
from saline_bew.journal import SalineJob
from saline_bew.protocol import (
    DEFAULT_SOCKET,
    MAX_LINE,
    Admit,
    AnyRequest,
    ListJobs,
    Output,
    Show,
    Stage,
    Submit,
    close_fds,
    command_words,
    parse_request,
    read_line,
    walltime,
)
from vjob import log
from vjob.errors import CommandError, InputError, UsageError, VjobError

_log = log.get("saline.socket")
TIMEOUT_S = 10.0
"""How long the manager waits for a whole request line once a client connected (and for its
answer to be taken): a deadline for the line, not per read, so a byte now and then cannot
stretch it."""
PER_USER_CONNECTIONS = 16
"""Connections one uid may hold open at once (root: no limit); more are refused on arrival."""
MAX_CONNECTIONS = 128
"""Connections of all users at once (each is a thread and a descriptor of the root manager)."""
OAR_ACCOUNT = "oar"
"""OAR's own account: admission rules run as it inside oarsub, so it (and root) may `admit`
for any user. It can already alter any OAR job; nobody else may speak for another user."""


class Refused(UsageError):
    """The caller may not do this (another user's vjob, another user's name)."""


def row(job: SalineJob) -> dict[str, Any]:
    """What `list` and `show` tell about a vjob."""
    return {
        "key": job.key,
        "user": job.user,
        "phase": job.phase,
        "site": job.site,
        "oar_job_id": job.oar_job_id,
        "hosts": list(job.hosts),
        "kills": job.kills,
        "restarts_from_scratch": job.restarts_from_scratch,
        "snapshot_label": job.snapshot_label,
        "snapshot_site": job.snapshot_site,
        "snapshot_at": job.snapshot_at,
        "error": job.error,
    }


class Handler:
    """What a request does, for the caller the kernel named (uid). No socket in here: the
    rules of who may do what are tested on their own."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def __call__(self, request: AnyRequest, uid: int, fds: list[int] | None = None) -> Any:
        caller = _user_name(uid)
        if isinstance(request, Submit):
            return self.submit(request, uid, caller, work_fd=(fds or [None])[0])
        if isinstance(request, Admit):
            return self.admit(request, uid, caller)
        if isinstance(request, ListJobs):
            jobs = journal.all_jobs(self.manager.ports.store)
            return [row(j) for j in jobs if uid == 0 or j.user == caller]
        job = self._own(grammar.word("key", request.key, grammar.KEY), uid, caller)
        if isinstance(request, Show):
            out = row(job)
            events = journal.events(self.manager.ports.store, job.key)
            out["journal"] = [
                {"at": e.at, "kind": e.kind, "site": e.site, "oar_job_id": e.oar_job_id, **e.detail} for e in events
            ]
            ended = next((e.detail for e in reversed(events) if e.kind == EventKind.FINISHED), {})
            out["exit_code"] = ended.get("exit_code")
            return out
        if isinstance(request, Output):
            fd = output.open_copy(self.manager.ports, job.key, request.stream)
            return WithFd({"key": job.key, "phase": job.phase, "stream": request.stream}, fd)
        if isinstance(request, Stage):
            work_fd = (fds or [None])[0]
            if work_fd is None and not request.declined:
                raise InputError("stage: no directory passed and no reason given (declined)")
            after = staging.receive(self.manager.ports, job.key, work_fd, reason=request.declined)
            return {"key": after.key, "staged": work_fd is not None}
        after = self.manager.request_cancel(job.key, by=caller)
        return {"key": after.key, "phase": after.phase}

    def submit(self, request: Submit, uid: int, caller: str, work_fd: int | None = None) -> dict[str, Any]:
        user = request.user or caller
        if user != caller and uid != 0:
            raise Refused(f"--user {grammar.short(user)}: only root may submit for another user (you are {caller})")
        # The grammar before pwd: a NUL in the name made getpwnam raise ValueError (fuzzed).
        grammar.word("user", user, grammar.USER)
        try:
            pwd.getpwnam(user)
        except KeyError:
            raise InputError(f"user = {grammar.short(user)}: no such user on the site master") from None
        try:
            job = self.manager.submit(
                user=user,
                image=request.image,
                command=list(request.command),
                vm_count=request.vms,
                vcpus=request.vcpus,
                memory_mb=request.memory,
                walltime=request.walltime,
                site=request.site,
                work_fd=work_fd,
            )
        except CommandError as exc:
            raise CommandError(
                exc.command, f"{exc} — the vjob is recorded and the manager will submit it when OAR answers"
            ) from None
        return {"key": job.key, "oar_job_id": job.oar_job_id, "site": job.site}

    def admit(self, request: Admit, uid: int, caller: str) -> dict[str, Any]:
        if uid != 0 and caller != OAR_ACCOUNT:
            raise Refused(f"admit: only OAR's admission rule (user {OAR_ACCOUNT}) may admit jobs (you are {caller})")
        user = grammar.word("user", request.user, grammar.USER)
        try:
            pwd.getpwnam(user)
        except KeyError:
            raise InputError(f"user = {grammar.short(user)}: no such user on the site master") from None
        job, oar = self.manager.admit(
            user=user,
            image=request.image,
            command=command_words(request.command),
            vm_count=request.vms,
            walltime=walltime(request.walltime_s),
            site=request.site,
        )
        return {
            "key": job.key,
            "site": job.site,
            "command": oar.command_line,
            "resources": job.vm_count * job.vcpus,
            "checkpoint": oar.checkpoint_s,
            "signal": oar.signal,
            "properties": oar.properties,
        }

    def _own(self, key: str, uid: int, caller: str) -> SalineJob:
        job = journal.get(self.manager.ports.store, key)
        if uid != 0 and job.user != caller:
            raise Refused(f"best-effort vjob {key}: belongs to another user; you ({caller}) may act on yours only")
        return job


def _user_name(uid: int) -> str:
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        raise Refused(f"uid {uid}: no such user on the site master") from None
    return grammar.word("user", name, grammar.USER) if uid != 0 else name


def peer_uid(conn: socket.socket) -> int:
    """The connecting process's uid, from the kernel (SO_PEERCRED: pid, uid, gid)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


class WithFd:
    """A result sent with an open descriptor (SCM_RIGHTS), closed here once sent."""

    def __init__(self, result: Any, fd: int) -> None:
        self.result = result
        self.fd = fd


def answer(handler: Handler, line: bytes, uid: int, fds: list[int] | None = None) -> dict[str, Any]:
    """The answer to one request line; every failure is an answer, never a dead server. A
    descriptor to send with it is under the key `_fd` (taken off by the connection)."""
    try:
        result = handler(parse_request(line), uid, fds)
        if isinstance(result, WithFd):
            return {"ok": True, "result": result.result, "_fd": result.fd}
        return {"ok": True, "result": result}
    except VjobError as exc:
        return {"ok": False, "error": str(exc), "exit": exc.exit_code}
    except Exception as exc:  # noqa: BLE001 - one bad request must not end the server
        _log.error("request failed", uid=uid, error=f"{type(exc).__name__}: {exc}"[:1000])
        return {"ok": False, "error": "internal error in the Saline manager (logged there)", "exit": 1}


class _Connection(socketserver.StreamRequestHandler):
    server: _UnixServer

    def setup(self) -> None:
        self.timeout = self.server.read_timeout_s  # every write of the answer, too
        super().setup()

    def handle(self) -> None:
        uid = peer_uid(self.request)
        fds: list[int] = []
        try:
            line = read_line(self.request, fds, deadline=time.monotonic() + self.server.read_timeout_s)
        except OSError:
            close_fds(fds)
            return  # the client went away or was too slow
        if not line.endswith(b"\n"):
            reply: dict[str, Any] = {"ok": False, "error": f"request: one line of at most {MAX_LINE} bytes", "exit": 2}
        else:
            reply = answer(self.server.handler, line, uid, fds[:1])
        close_fds(fds)
        out_fd = reply.pop("_fd", None)
        data = json.dumps(reply, default=str).encode() + b"\n"
        self.request.settimeout(self.server.read_timeout_s)
        try:
            with contextlib.suppress(OSError):
                if out_fd is None:
                    self.wfile.write(data)
                else:
                    sent = socket.send_fds(self.request, [data], [out_fd])
                    self.request.sendall(data[sent:])
        finally:
            if out_fd is not None:
                os.close(out_fd)


class _UnixServer(socketserver.ThreadingUnixStreamServer):
    """A thread per connection, within limits: the socket is open to every user (0666), and
    each connection costs the root manager a thread and a descriptor. A uid over its share, or
    everyone over the total, is answered with a refusal at once (no thread) and closed; root
    is never refused (the operator's own commands). A connection's request line must arrive
    whole within `read_timeout_s`."""

    daemon_threads = True
    handler: Handler

    def __init__(self, path: str, *, per_user: int, total: int, read_timeout_s: float) -> None:
        super().__init__(path, _Connection, bind_and_activate=False)
        self.per_user = per_user
        self.total = total
        self.read_timeout_s = read_timeout_s
        self._lock = threading.Lock()
        self._open: dict[int, int] = {}
        self._refused_logged: dict[int, float] = {}

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            uid = peer_uid(request)
        except OSError:
            self.shutdown_request(request)
            return
        why = self._enter(uid)
        if why:
            self._refuse(request, uid, why)
            return
        try:
            threading.Thread(target=self._serve_one, args=(request, client_address, uid), daemon=True).start()
        except BaseException:
            self._leave(uid)
            self.shutdown_request(request)
            raise

    def _serve_one(self, request: Any, client_address: Any, uid: int) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 - socketserver's own stance: log, close, serve on
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self._leave(uid)

    def _enter(self, uid: int) -> str:
        """Count a new connection of `uid`, or say why it is refused."""
        with self._lock:
            mine, everyone = self._open.get(uid, 0), sum(self._open.values())
            if uid != 0 and mine >= self.per_user:
                return f"uid {uid} already has {mine} connections open (at most {self.per_user})"
            if uid != 0 and everyone >= self.total:
                return f"the manager already serves {everyone} connections (at most {self.total})"
            self._open[uid] = mine + 1
            return ""

    def _leave(self, uid: int) -> None:
        with self._lock:
            left = self._open.get(uid, 0) - 1
            if left > 0:
                self._open[uid] = left
            else:
                self._open.pop(uid, None)

    def open_connections(self) -> dict[int, int]:
        """Connections open now, per uid (for tests and logs)."""
        with self._lock:
            return dict(self._open)

    def _refuse(self, request: Any, uid: int, why: str) -> None:
        """One refusal line, never waiting on the client (it is not read: a full buffer drops
        it), then closed. Logged once a minute per uid, not once per connection of a flood."""
        now = time.monotonic()
        if now - self._refused_logged.get(uid, -60.0) >= 60.0:
            self._refused_logged[uid] = now
            _log.warning("connection refused", uid=uid, reason=why)
        line = json.dumps({"ok": False, "error": f"Saline manager busy: {why}; try again later", "exit": 1})
        with contextlib.suppress(OSError):
            request.send(line.encode() + b"\n", socket.MSG_DONTWAIT)
        self.shutdown_request(request)


class Server:
    """The socket server of one manager, in threads beside its loop."""

    def __init__(
        self,
        manager: Any,
        path: Path = DEFAULT_SOCKET,
        *,
        group: str | None = None,
        per_user: int = PER_USER_CONNECTIONS,
        total: int = MAX_CONNECTIONS,
        read_timeout_s: float = TIMEOUT_S,
    ) -> None:
        """`per_user`, `total`, `read_timeout_s`: [saline] socket_connections_per_user,
        socket_connections, socket_read_timeout_s (the connection limits, _UnixServer)."""
        if per_user < 1 or total < 1 or not 0 < read_timeout_s <= 3600:
            raise UsageError(
                f"Saline socket limits: per_user = {per_user}, total = {total} must be >= 1, "
                f"read_timeout_s = {read_timeout_s} in (0, 3600]"
            )
        self.path = Path(path)
        self.group = group
        self.manager = manager
        self.per_user, self.total, self.read_timeout_s = per_user, total, read_timeout_s
        self._server: _UnixServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Server:
        gid = _group_id(self.group) if self.group else None
        _prepare(self.path)
        server = _UnixServer(
            str(self.path), per_user=self.per_user, total=self.total, read_timeout_s=self.read_timeout_s
        )
        server.handler = Handler(self.manager)
        old = os.umask(0o177)  # no window in which the socket is more open than configured
        try:
            server.server_bind()
        finally:
            os.umask(old)
        if gid is not None:
            os.chown(self.path, -1, gid, follow_symlinks=False)
            os.chmod(self.path, 0o660)
        else:
            os.chmod(self.path, 0o666)
        server.server_activate()
        self.manager.ports.socket = self.path  # the holder's OAR command names it (submission.request)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        self._thread.start()
        _log.info(
            "listening",
            socket=str(self.path),
            group=self.group or "everyone",
            per_user=self.per_user,
            total=self.total,
            read_timeout_s=self.read_timeout_s,
        )
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _group_id(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise UsageError(f"--socket-group {name!r}: no such group") from None


def _prepare(path: Path) -> None:
    """The socket's directory is created root-owned 0755 when missing, and must not be
    writable by others (who could replace the socket with their own); a stale socket from a
    previous run is removed, anything else at that path is refused."""
    parent = path.parent
    if not parent.exists():
        parent.mkdir(parents=True, mode=0o755)
    st = os.lstat(parent)
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"socket directory {parent}: not a directory (a symlink?)")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise UsageError(
            f"socket directory {parent}: must be owned by uid {os.geteuid()} and not writable by others "
            f"(owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})"
        )
    try:
        existing = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(existing.st_mode):
        raise UsageError(f"socket {path}: something else is there; remove it")
    os.unlink(path)
