"""The node service's socket loop: who is calling (SO_PEERCRED), how much each uid may hold, how
long anything may take, and what every request gets back.

Why threads with hard bounds rather than an event loop: an operation runs commands that block
(ip, iptables, ganesha, scontrol), and the limits that matter are plain counts: connections
in all (`max_connections`, one thread each), per uid (`max_connections_per_user`, which also
holds a slot while a timed-out operation still runs), requests per uid per minute, a deadline to
send one whole line (idle and slow-loris connections are closed) and a deadline per operation
(the caller is answered; the operation's thread finishes in the background, its slot held).
Saline's socket fell to idle connections: here nothing a caller does keeps a thread past its
deadlines, and nothing it sends reaches an operation before protocol.check has passed it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioning.node_service import protocol
from provisioning.node_service.grant import Grant, JobAuthority
from provisioning.node_service.protocol import OperationSpec, ProtocolError, Request
from vjob import log
from vjob.errors import VjobError

_CRED = struct.Struct("3i")
"""struct ucred {pid_t pid; uid_t uid; gid_t gid;} as SO_PEERCRED returns it."""
MAX_ERROR_CHARS = 500
QUIET_S = 10.0
"""A uid's refusals at accept, and its requests refused before their op was read, are logged at
most once in this time (the others are refused just the same)."""


@dataclass(frozen=True)
class Limits:
    """The bounds every caller meets (from `[node]`, see provisioning/node_service/config.py)."""

    max_connections: int = 64
    max_connections_per_user: int = 4
    requests_per_minute_per_user: int = 600
    read_deadline_s: float = 5.0
    operation_deadline_s: float = 20.0


@dataclass(frozen=True)
class Peer:
    """The caller as the kernel says (never as the caller says)."""

    pid: int
    uid: int
    gid: int


def peer_of(conn: socket.socket) -> Peer:
    pid, uid, gid = _CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return Peer(pid, uid, gid)


class _Ledger:
    """Per-uid slots and request counts, under one lock."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.lock = threading.Lock()
        self.slots: dict[int, int] = {}
        self.total = 0
        self.minute: dict[int, tuple[int, int]] = {}

    def take(self, uid: int) -> str:
        """'' when `uid` may open one more connection (its slot taken), else the reason."""
        with self.lock:
            if self.total >= self.limits.max_connections:
                return f"the node service is serving {self.total} connections, its limit: try again"
            held = self.slots.get(uid, 0)
            if held >= self.limits.max_connections_per_user:
                return f"uid {uid} holds {held} connections or running operations, the limit per user"
            self.slots[uid] = held + 1
            self.total += 1
            return ""

    def give(self, uid: int) -> None:
        with self.lock:
            self.total -= 1
            left = self.slots.get(uid, 1) - 1
            if left > 0:
                self.slots[uid] = left
            else:
                self.slots.pop(uid, None)

    def count_request(self, uid: int) -> bool:
        """True when `uid` is still within its requests of this minute (and counts this one)."""
        now = int(time.monotonic() // 60)
        with self.lock:
            minute, count = self.minute.get(uid, (now, 0))
            if minute != now:
                minute, count = now, 0
            if count >= self.limits.requests_per_minute_per_user:
                return False
            self.minute[uid] = (minute, count + 1)
            return True


class NodeService:
    """The service on one socket: bind(), then serve() until `stop` is set, then close()."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        operations: Mapping[str, OperationSpec],
        authority: JobAuthority,
        names: frozenset[str],
        limits: Limits = Limits(),
    ) -> None:
        self.path = Path(path)
        self.operations = dict(operations)
        self.authority = authority
        self.names = frozenset(names)
        self.limits = limits
        self.ledger = _Ledger(limits)
        self.log = log.get("node-service")
        self.sock: socket.socket | None = None
        self.threads: set[threading.Thread] = set()
        self._threads_lock = threading.Lock()
        self._last_said: dict[tuple[int, str], float] = {}

    # -- the socket ------------------------------------------------------------------------------
    def bind(self) -> None:
        """Listen on `path`: its directory root's and 0755 (made when missing), a stale socket
        replaced, never anything else at that path; the socket 0666 (every local user may ask,
        the checks are per request)."""
        parent = self.path.parent
        parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        info = parent.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise VjobError(f"{parent}: the socket's directory must be ours and writable by no one else")
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(self.path.lstat().st_mode):
                raise VjobError(f"{self.path}: exists and is not a socket; not replacing it")
            self.path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o666)
        sock.listen(128)
        sock.settimeout(0.5)
        self.sock = sock

    def serve(self, stop: threading.Event, tick: Callable[[], None] = lambda: None) -> None:
        """Accept until `stop` is set; `tick` after every accept or half second (a watchdog)."""
        assert self.sock is not None, "bind() first"
        while not stop.is_set():
            tick()
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:  # EMFILE and the like: wait, never die
                self.log.warning("accept failed", error=str(exc))
                time.sleep(0.2)
                continue
            self._admit(conn)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def _admit(self, conn: socket.socket) -> None:
        try:
            peer = peer_of(conn)
        except OSError:
            conn.close()
            return
        reason = self.ledger.take(peer.uid)
        if reason:
            if self._worth_saying(peer.uid, "limit"):
                self.log.warning("connection refused", uid=peer.uid, reason=reason)
            _send_and_close(conn, protocol.refused(reason))
            return
        thread = threading.Thread(target=self._connection, args=(conn, peer), name=f"node-uid{peer.uid}", daemon=True)
        with self._threads_lock:
            self.threads.add(thread)
        try:
            thread.start()
        except RuntimeError:  # no thread to be had: the caller is told, the slot given back
            with self._threads_lock:
                self.threads.discard(thread)
            self.ledger.give(peer.uid)
            _send_and_close(conn, protocol.refused("the node service is out of threads: try again"))

    # -- one connection --------------------------------------------------------------------------
    def _connection(self, conn: socket.socket, peer: Peer) -> None:
        """Requests of one connection, one at a time, until EOF, a deadline or a framing error.
        The uid's slot is given back only when no operation of this connection still runs."""
        pending: threading.Thread | None = None
        try:
            buffer = b""
            while True:
                line, buffer, why = _read_line(conn, buffer, self.limits.read_deadline_s)
                if line is None:
                    if why and self._worth_saying(peer.uid, "closed"):
                        self.log.info("connection closed", uid=peer.uid, reason=why)
                    if why.startswith("request longer"):
                        _send(conn, protocol.refused(why))
                    return
                answer, pending = self._request(line, peer)
                if not _send(conn, answer) or pending is not None:
                    return
        finally:
            with contextlib.suppress(OSError):
                conn.close()
            if pending is not None:
                pending.join()
            self.ledger.give(peer.uid)
            with self._threads_lock:
                self.threads.discard(threading.current_thread())

    def _request(self, line: bytes, peer: Peer) -> tuple[dict[str, Any], threading.Thread | None]:
        """The answer to one line, and the operation's thread when it outlived its deadline."""
        started = time.monotonic()
        fields: dict[str, Any] = {"uid": peer.uid, "pid": peer.pid, "op": None, "job": None}
        late: threading.Thread | None = None
        try:
            if not self.ledger.count_request(peer.uid):
                most = self.limits.requests_per_minute_per_user
                raise ProtocolError(f"uid {peer.uid}: more than {most} requests a minute, try again later")
            request = protocol.parse(line, self.operations)
            fields.update(op=request.op, job=request.job, node=request.node)
            if request.node not in self.names:
                served = ", ".join(sorted(self.names))
                raise ProtocolError(
                    f"field 'node': {protocol.shown(request.node)} is not served here (this service serves {served})"
                )
            answer, late = self._run(request, peer)
        except VjobError as exc:
            answer = protocol.refused(str(exc)[:MAX_ERROR_CHARS])
        fields["outcome"] = "ok" if answer.get("ok") else str(answer.get("error", ""))[:200]
        if fields["op"] is not None or self._worth_saying(peer.uid, "refused"):
            self.log.info("request", ms=round((time.monotonic() - started) * 1000, 1), **fields)
        return answer, late

    def _worth_saying(self, uid: int, kind: str) -> bool:
        """Whether to log a refusal of `kind` for `uid`: once per QUIET_S, so a user hammering
        the limits or sending garbage cannot fill the node's disk with the service's log."""
        now = time.monotonic()
        with self._threads_lock:
            if now - self._last_said.get((uid, kind), -QUIET_S) < QUIET_S:
                return False
            self._last_said[(uid, kind)] = now
            return True

    def _run(self, request: Request, peer: Peer) -> tuple[dict[str, Any], threading.Thread | None]:
        """The grant and the operation in a thread of their own, waited for up to the deadline."""
        spec = self.operations[request.op]
        deadline = spec.deadline_s or self.limits.operation_deadline_s
        box: dict[str, Any] = {}
        worker = threading.Thread(target=self._work, args=(request, peer, spec, box), name="node-op", daemon=True)
        worker.start()
        worker.join(deadline)
        if worker.is_alive():
            return protocol.refused(
                f"{request.op}: no answer within {deadline:g} s (the operation may still complete)"
            ), worker
        return box.get("answer") or protocol.refused(f"{request.op}: internal error (see the node service's log)"), None

    def _work(self, request: Request, peer: Peer, spec: OperationSpec, box: dict[str, Any]) -> None:
        try:
            grant = self._grant(request, peer, spec.after_end)
            result = spec.run(grant, request.fields)
            answer = protocol.ok(result)
            if len(protocol.encode(answer)) > protocol.MAX_ANSWER_BYTES:
                raise ValueError(f"answer longer than {protocol.MAX_ANSWER_BYTES} bytes")
            box["answer"] = answer
        except VjobError as exc:
            box["answer"] = protocol.refused(str(exc)[:MAX_ERROR_CHARS])
        except Exception:  # a broken operation must not take the service with it
            self.log.exception("operation failed", op=request.op, job=request.job, uid=peer.uid)

    def _grant(self, request: Request, peer: Peer, after_end: bool = False) -> Grant:
        """The RMS's word that `peer` owns a job running on the request's node, or a refusal
        (a clean-up operation, `after_end`, also takes a job of `peer` that no longer runs)."""
        grant = self.authority.grant(request.job, request.node)
        owned = getattr(self.authority, "owned", None)  # an authority may know running jobs only
        if grant is None and after_end and owned is not None:
            grant = owned(request.job, request.node)
            if grant is not None and grant.uid == peer.uid:
                return grant
        if grant is None:
            raise ProtocolError(f"job {request.job!r} is not running on node {request.node!r}")
        if grant.uid != peer.uid or grant.node != request.node or request.node not in grant.nodes:
            raise ProtocolError(f"job {request.job!r} is not a job of uid {peer.uid} on node {request.node!r}")
        return grant


def _read_line(conn: socket.socket, buffer: bytes, deadline_s: float) -> tuple[bytes | None, bytes, str]:
    """(the next line, what follows it, '') or (None, b'', why) at EOF, past the deadline (the
    whole line must arrive within it: a byte a second does not keep a connection) or when a
    line grows past the request limit."""
    limit = protocol.MAX_REQUEST_BYTES
    end = time.monotonic() + deadline_s
    while b"\n" not in buffer:
        if len(buffer) >= limit:
            return None, b"", f"request longer than {limit} bytes"
        left = end - time.monotonic()
        if left <= 0:
            return None, b"", "idle or slow past the read deadline" if buffer else "idle past the read deadline"
        conn.settimeout(left)
        try:
            chunk = conn.recv(limit + 1 - len(buffer))
        except TimeoutError:
            continue
        except OSError as exc:
            return None, b"", f"receive failed: {exc.strerror or exc}"
        if not chunk:
            return None, b"", "request cut short" if buffer.strip() else ""
        buffer += chunk
    line, _, rest = buffer.partition(b"\n")
    if len(line) + 1 > limit:
        return None, b"", f"request longer than {limit} bytes"
    return line, rest, ""


def _send(conn: socket.socket, answer: Mapping[str, Any], timeout_s: float = 2.0) -> bool:
    """Send one answer line (a caller that does not read it gets `timeout_s`, not forever)."""
    try:
        conn.settimeout(timeout_s)
        conn.sendall(protocol.encode(answer))
        return True
    except OSError:
        return False


def _send_and_close(conn: socket.socket, answer: Mapping[str, Any]) -> None:
    """A refusal from the accept loop, which must not wait on any caller."""
    _send(conn, answer, 0.1)
    with contextlib.suppress(OSError):
        conn.close()
