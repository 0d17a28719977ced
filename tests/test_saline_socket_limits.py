"""The Saline manager's 0666 socket against a user who floods it (issue 39, item 7).

Every user may connect, and each connection cost the root manager a thread and a descriptor
for as long as the client liked (10 s per read, renewed by each byte). Now a uid holds at most
`socket_connections_per_user` at once, everyone together `socket_connections` (root is never
refused), and a request line must arrive whole within `socket_read_timeout_s`. The flooding
clients are real processes that dropped to other uids, so the kernel (SO_PEERCRED) names them.
"""

from __future__ import annotations

import json
import os
import pwd
import select
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from saline_bew import client, server
from tests.services import wait_for
from vjob.errors import VjobError
from vjob.store.db import Store


class _Child:
    """A forked child that dropped to `uid` (setgroups, setgid, setuid) and runs `work`; what
    `work` returns comes back as JSON, and the child lives on (holding its connections) until
    `end()`. A fork, not an exec: this venv's interpreter lives under /root."""

    holds: ClassVar[set[int]] = set()
    """The parent's ends of the children's hold pipes (a child closes the others' at once)."""

    def __init__(self, uid: int, work: Callable[[], object]) -> None:
        out_r, out_w = os.pipe()
        hold_r, hold_w = os.pipe()
        gid = pwd.getpwuid(uid).pw_gid
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into pytest
            try:
                for fd in (out_r, hold_w, *_Child.holds):  # another child's end is its parent's alone
                    os.close(fd)
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                result: object = work()
            except BaseException as exc:  # noqa: BLE001 - report, then leave the child
                result = {"child error": f"{type(exc).__name__}: {exc}"}
            try:
                os.write(out_w, json.dumps(result).encode() + b"\n")
                os.close(out_w)
                os.read(hold_r, 1)  # until the parent ends us
            finally:
                os._exit(0)
        os.close(out_w)
        os.close(hold_r)
        self._hold = hold_w
        _Child.holds.add(hold_w)
        with os.fdopen(out_r) as out:
            line = out.readline()
        assert line, f"the child of uid {uid} said nothing"
        self.result = json.loads(line)

    def end(self) -> None:
        _Child.holds.discard(self._hold)
        os.close(self._hold)
        os.waitpid(self.pid, 0)


def _flood(uid: int, path: Path, count: int) -> tuple[_Child, dict[str, Any]]:
    """`count` connections of `uid` that say nothing: how many the manager held, how many it
    refused (one line and closed at once), and the first reasons."""

    def work() -> dict[str, Any]:
        conns = []
        for _ in range(count):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(str(path))
            conns.append(c)
        refused, reasons = 0, []
        quiet, until = list(conns), time.monotonic() + 3.0
        while quiet and (left := until - time.monotonic()) > 0:
            for c in select.select(quiet, [], [], left)[0]:
                quiet.remove(c)
                refused += 1
                data = c.recv(4096)
                if data:
                    reasons.append(json.loads(data)["error"])
        _keep.extend(conns)  # held until the child ends
        return {"held": count - refused, "refused": refused, "reasons": reasons[:3]}

    child = _Child(uid, work)
    return child, child.result


_keep: list[socket.socket] = []


def _list_as(uid: int, path: Path) -> dict[str, Any]:
    def work() -> dict[str, Any]:
        try:
            return {"ok": client.call(path, {"op": "list"}, timeout_s=30)}
        except VjobError as exc:
            return {"error": str(exc)}

    child = _Child(uid, work)
    child.end()
    return dict(child.result)


def _end(child: _Child) -> None:
    child.end()


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[SimpleNamespace]:
    store = Store(f"sqlite:///{tmp_path / 'vjob.sqlite'}")
    store.upgrade()
    yield SimpleNamespace(ports=SimpleNamespace(store=store, socket=None))
    store.close()


@pytest.fixture
def where() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="vjob-saline-limits-"))
    os.chmod(d, 0o755)  # reachable by other users, writable by root only
    yield d
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


NOBODY = pwd.getpwnam("nobody").pw_uid
DAEMON = pwd.getpwnam("daemon").pw_uid


def test_one_user_holds_at_most_its_share_and_root_is_still_answered(manager: SimpleNamespace, where: Path) -> None:
    """Before: every connection was accepted and given a thread (40 of 40 held)."""
    path = where / "saline.sock"
    per_user = getattr(server, "PER_USER_CONNECTIONS", 16)
    with server.Server(manager, path):  # the shipped defaults
        proc, seen = _flood(NOBODY, path, per_user + 24)
        try:
            assert seen["held"] == per_user and seen["refused"] == 24, seen
            assert any("busy" in str(r) and f"uid {NOBODY}" in str(r) for r in seen["reasons"]), seen
            assert _list_as(0, path) == {"ok": []}  # root while nobody's share is taken
            assert _list_as(DAEMON, path) == {"ok": []}  # and any other user
        finally:
            _end(proc)


def test_all_users_together_hold_at_most_the_total(manager: SimpleNamespace, where: Path) -> None:
    path = where / "saline.sock"
    with server.Server(manager, path, per_user=3, total=5, read_timeout_s=120) as srv:
        first, a = _flood(NOBODY, path, 5)
        second, b = _flood(DAEMON, path, 3)
        try:
            assert (a["held"], a["refused"]) == (3, 2), a
            assert (b["held"], b["refused"]) == (2, 1), b
            assert any("at most 5" in str(r) for r in b["reasons"]), b
            assert _list_as(0, path) == {"ok": []}  # root is never refused
            assert "busy" in str(_list_as(DAEMON, path).get("error"))
        finally:
            _end(first)
        wait_for(
            lambda: srv._server is not None and NOBODY not in srv._server.open_connections(),
            30,
            "nobody's connections counted out",
        )
        try:
            assert _list_as(DAEMON, path) == {"ok": []}  # room again once they are gone
        finally:
            _end(second)


def test_a_request_dripped_a_byte_at_a_time_is_cut_at_the_deadline(manager: SimpleNamespace, where: Path) -> None:
    """Before: the 10 s time-out was per read; a byte every 0.3 s held the thread forever."""
    path = where / "saline.sock"
    with server.Server(manager, path):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(path))
            request = b'{"op": "list"' + b" " * 400 + b"}\n"  # 2 minutes at this pace
            closed_after = None
            t0 = time.monotonic()
            for byte in request[:-1]:
                try:
                    conn.send(bytes([byte]))
                except OSError:  # the manager closed it: writing fails
                    closed_after = time.monotonic() - t0
                    break
                if select.select([conn], [], [], 0.3)[0]:
                    if conn.recv(4096) == b"":
                        closed_after = time.monotonic() - t0
                        break
                if time.monotonic() - t0 > 60:
                    break
            assert closed_after is not None, "the manager still held a request dripped for 60 s"
