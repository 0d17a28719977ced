"""Asking the node service, as the ordinary user a pilot runs as.

Why a client this small: a pilot sends one line and reads one line; everything it may ask is
checked on the other side, so the client only frames, bounds what it reads, and turns the
service's refusal into a VjobError carrying the service's own message.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from provisioning.node_service import protocol
from vjob.errors import VjobError


class NodeServiceError(VjobError):
    """The node service refused a request: the message is the service's."""


class NodeServiceUnavailable(NodeServiceError):
    """The service could not be asked (no socket, refused, no answer in time): unlike a
    refusal, this may mend by itself, so a caller may retry later."""


class NodeClient:
    """One service at `path`; every call opens its own connection (the service closes idle ones)."""

    def __init__(self, path: str, timeout: float = 30.0) -> None:
        self.path = path
        self.timeout = timeout

    def call(self, op: str, *, job: str, node: str, **fields: Any) -> dict[str, Any]:
        """The answer's fields (without "ok") to `op` for `job` on `node`, or NodeServiceError."""
        line = json.dumps({"op": op, "job": job, "node": node, **fields}, separators=(",", ":")).encode() + b"\n"
        if len(line) > protocol.MAX_REQUEST_BYTES:
            raise NodeServiceError(f"{op}: request of {len(line)} bytes, more than {protocol.MAX_REQUEST_BYTES}")
        raw = self._exchange(op, line)
        try:
            answer = json.loads(raw)
        except ValueError:
            raise NodeServiceUnavailable(f"{op}: the node service at {self.path} answered garbage") from None
        if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
            raise NodeServiceUnavailable(f"{op}: the node service at {self.path} answered without 'ok'")
        if not answer["ok"]:
            raise NodeServiceError(f"node service: {str(answer.get('error', 'refused'))[:1000]}")
        answer.pop("ok")
        return answer

    def _exchange(self, op: str, line: bytes) -> bytes:
        end = time.monotonic() + self.timeout
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
                sock.settimeout(self.timeout)
                sock.connect(self.path)
                sock.sendall(line)
                buffer = b""
                while b"\n" not in buffer:
                    left = end - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    sock.settimeout(left)
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    buffer += chunk
                    if len(buffer) > protocol.MAX_ANSWER_BYTES:
                        raise NodeServiceUnavailable(f"{op}: answer longer than {protocol.MAX_ANSWER_BYTES} bytes")
        except TimeoutError:
            raise NodeServiceUnavailable(
                f"{op}: no answer from the node service at {self.path} within {self.timeout:g} s"
            ) from None
        except OSError as exc:
            raise NodeServiceUnavailable(
                f"{op}: cannot reach the node service at {self.path}: {exc.strerror or exc}"
            ) from None
        if b"\n" not in buffer:
            raise NodeServiceUnavailable(
                f"{op}: the node service at {self.path} closed the connection without an answer"
            )
        return buffer.partition(b"\n")[0]
