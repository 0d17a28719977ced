"""The connection between a multi-node job's leader pilot and its per-node member pilots.

Why a TCP connection of our own: the pilots of one job share no directory (each node has its
own pilot directory, and no shared filesystem is assumed), the cut needs answers within
seconds (PAUSE on every node before any SAVE), and a dead peer must be noticed (EOF, or TCP
keep-alive on a silent one). Why a token and HMACs rather than TLS: the standard library has
no TLS with a pre-shared key before Python 3.13, and the job's user has no certificate. The
leader makes a one-time random token and hands it to its members in srun's environment (only
the job's user can read a process's environment, never on a command line); both sides prove
they know it (challenge-response over fresh nonces, so it never travels), every later message
carries an HMAC keyed by the session (with a sequence number: no replay, no reordering), and
the one secret a member receives, the job's ssh private key, is encrypted with a SHAKE-256
keystream of the session key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from plugins.member_launch import LEADER_ENV, TOKEN_ENV
from vjob.errors import VjobError

MAX_FRAME = 1 << 20
"""A message's largest size: a job description without its script is a few KiB."""
HANDSHAKE_FRAME = 4096
"""A handshake message's largest size (a nonce, a proof, a node name): before the token is
proven, a stranger gets no megabyte buffers."""
_MAC = 32
_TOKEN_RE = re.compile(r"[0-9a-f]{64}")
_LEN = struct.Struct("!I")


class LinkError(VjobError):
    """The other pilot is gone, silent past a time-out, or not who it claims to be."""


class LinkClosed(LinkError):
    """The other end closed or reset the connection (a leader over its limit of strangers being
    handshaken closes a new one at once: the member tries again)."""


def _key(token: str, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(bytes.fromhex(token), label + b"|" + b"|".join(parts), hashlib.sha256).digest()


def keep_alive(sock: socket.socket) -> None:
    """A peer whose host died sends no EOF: the kernel probes a silent connection after 10 s
    and gives up after three unanswered probes 5 s apart."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)


@dataclass
class Link:
    """One authenticated connection; `leader` says which side this end is."""

    sock: socket.socket
    session: bytes
    leader: bool
    peer: str = ""
    _sent: int = 0
    _received: int = 0
    _closed: bool = field(default=False, repr=False)

    def _mac(self, from_leader: bool, seq: int, body: bytes) -> bytes:
        return hmac.new(
            self.session, (b"L" if from_leader else b"M") + struct.pack("!Q", seq) + body, hashlib.sha256
        ).digest()

    def send(self, msg: dict[str, Any], timeout: float = 30.0) -> None:
        body = json.dumps(msg, separators=(",", ":")).encode()
        frame = self._mac(self.leader, self._sent, body) + body
        self._sent += 1
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall(_LEN.pack(len(frame)) + frame)
        except OSError as exc:
            raise LinkError(f"{self.peer or 'peer'}: cannot send {msg.get('op', 'a reply')}: {exc}") from None

    def recv(self, timeout: float | None) -> dict[str, Any]:
        """The next message; `timeout` None waits as long as the connection lives."""
        frame = _read_frame(self.sock, timeout, self.peer)
        mac, body = frame[:_MAC], frame[_MAC:]
        if not hmac.compare_digest(mac, self._mac(not self.leader, self._received, body)):
            raise LinkError(f"{self.peer or 'peer'}: a message failed its HMAC (altered, replayed or reordered)")
        self._received += 1
        msg = json.loads(body)
        if not isinstance(msg, dict):
            raise LinkError(f"{self.peer or 'peer'}: a message is not a JSON object")
        return msg

    def seal(self, secret: str) -> str:
        """`secret` encrypted for the other end (one secret per session: the keystream is not reused)."""
        data = secret.encode()
        return bytes(a ^ b for a, b in zip(data, _stream(self.session, len(data)), strict=True)).hex()

    def unseal(self, sealed: str) -> str:
        data = bytes.fromhex(sealed)
        return bytes(a ^ b for a, b in zip(data, _stream(self.session, len(data)), strict=True)).decode()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self.sock.close()
            except OSError:
                pass


def _stream(session: bytes, size: int) -> bytes:
    return hashlib.shake_256(b"vjob-member-secret|" + session).digest(size)


def _read_exact(sock: socket.socket, size: int, peer: str, deadline: float | None = None) -> bytes:
    """`size` bytes; with `deadline` (time.monotonic()) the whole read must end by then, so a
    peer dripping one byte at a time cannot stretch one time-out into many."""
    buf = bytearray()
    while len(buf) < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LinkError(f"{peer or 'peer'}: no answer within the time-out")
            sock.settimeout(left)
        try:
            chunk = sock.recv(size - len(buf))
        except TimeoutError:
            raise LinkError(f"{peer or 'peer'}: no answer within the time-out") from None
        except OSError as exc:
            raise LinkClosed(f"{peer or 'peer'}: connection lost: {exc}") from None
        if not chunk:
            raise LinkClosed(f"{peer or 'peer'}: connection closed")
        buf += chunk
    return bytes(buf)


def _read_frame(
    sock: socket.socket, timeout: float | None, peer: str, *, deadline: float | None = None, limit: int = MAX_FRAME
) -> bytes:
    sock.settimeout(timeout)
    (size,) = _LEN.unpack(_read_exact(sock, _LEN.size, peer, deadline))
    if not _MAC < size <= limit:
        raise LinkError(f"{peer or 'peer'}: a frame of {size} bytes (at most {limit})")
    return _read_exact(sock, size, peer, deadline)


def _plain(sock: socket.socket, msg: dict[str, Any]) -> None:
    body = json.dumps(msg, separators=(",", ":")).encode()
    sock.sendall(_LEN.pack(len(body) + _MAC) + bytes(_MAC) + body)


def _plain_recv(sock: socket.socket, deadline: float, peer: str) -> dict[str, Any]:
    """A handshake message: small (HANDSHAKE_FRAME), and whole by `deadline` — before the token
    is proven the peer is anyone who can reach the port."""
    try:
        frame = _read_frame(sock, None, peer, deadline=deadline, limit=HANDSHAKE_FRAME)
        msg = json.loads(frame[_MAC:])
    except ValueError:
        raise LinkError(f"{peer or 'peer'}: the handshake is not JSON") from None
    if not isinstance(msg, dict):
        raise LinkError(f"{peer or 'peer'}: the handshake is not a JSON object")
    return msg


def _hex(msg: dict[str, Any], key: str, size: int, peer: str) -> bytes:
    value = msg.get(key)
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != size:
        raise LinkError(f"{peer or 'peer'}: handshake field {key!r} is not {size} bytes of hex")
    return raw


def accept(sock: socket.socket, token: str, timeout: float = 30.0) -> tuple[Link, str]:
    """The leader's side of the handshake on an accepted connection: (link, the member's node).

    A member that does not know the token is refused (LinkError) before it learns anything;
    the whole handshake ends within `timeout` seconds, however slowly the peer writes.
    """
    deadline = time.monotonic() + timeout
    try:
        peer = "member at {}:{}".format(*sock.getpeername()[:2])
        sock.settimeout(timeout)
        ours = secrets.token_bytes(16)
        _plain(sock, {"v": 1, "nonce": ours.hex()})
    except OSError as exc:
        raise LinkError(f"a connection to the leader: {exc}") from None
    hello = _plain_recv(sock, deadline, peer)
    theirs = _hex(hello, "nonce", 16, peer)
    node = hello.get("node")
    if not isinstance(node, str) or not 0 < len(node) <= 64:
        raise LinkError(f"{peer}: handshake field 'node' missing or too long")
    if not hmac.compare_digest(_hex(hello, "proof", 32, peer), _key(token, b"member", ours, theirs, node.encode())):
        raise LinkError(f"{peer}: refused: it does not know the job's token")
    try:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        _plain(sock, {"proof": _key(token, b"leader", ours, theirs).hex()})
    except OSError as exc:
        raise LinkError(f"{peer}: {exc}") from None
    keep_alive(sock)
    return Link(sock, _key(token, b"session", ours, theirs), leader=True, peer=f"member on {node[:64]}"), node


def connect(address: str, token: str, node: str, timeout: float = 30.0) -> Link:
    """A member's connection to its leader (`host:port`), the leader proven to know the token."""
    if not _TOKEN_RE.fullmatch(token):
        raise LinkError(f"${TOKEN_ENV}: not a token of 64 hex digits")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise LinkError(f"${LEADER_ENV} = {address[:80]!r}: must be host:port")
    peer = f"leader at {address}"
    deadline = time.monotonic() + timeout
    pause = 0.1
    while True:  # a leader busy with strangers may close a connection before its nonce: try again
        try:
            left = max(deadline - time.monotonic(), 0.1)
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=left)
        except OSError as exc:
            raise LinkError(f"{peer}: cannot connect: {exc}") from None
        try:
            theirs = _hex(_plain_recv(sock, deadline, peer), "nonce", 16, peer)
            break
        except LinkClosed:
            sock.close()
            if time.monotonic() + pause >= deadline:
                raise
        except LinkError:
            sock.close()
            raise
        time.sleep(pause)
        pause = min(2 * pause, 2.0)
    try:
        ours = secrets.token_bytes(16)
        proof = _key(token, b"member", theirs, ours, node.encode())
        _plain(sock, {"node": node, "nonce": ours.hex(), "proof": proof.hex()})
        answer = _plain_recv(sock, deadline, peer)
        if not hmac.compare_digest(_hex(answer, "proof", 32, peer), _key(token, b"leader", theirs, ours)):
            raise LinkError(f"{peer}: refused: it does not know the job's token")
    except (LinkError, OSError) as exc:
        sock.close()
        raise exc if isinstance(exc, LinkError) else LinkError(f"{peer}: {exc}") from None
    keep_alive(sock)
    return Link(sock, _key(token, b"session", theirs, ours), leader=False, peer=peer)
