"""Per-node pilots against strangers on the network (issue 39, items 8 and 11).

The leader's port is reachable by anyone on the nodes' network, and what crosses the link can
be read by whoever sniffs it. Real TCP on the loopback, the real handshake; no VM is needed:
the member's end answers the leader's requests itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pilot.job import member_job
from pilot.members import leader as member_leader
from pilot.members import link as member_link
from pilot.members.leader import Members, MemberVM
from pilot.members.link import LinkError
from pilot.multinode import network_of
from provisioning import network


def _silent(address: str, count: int) -> list[socket.socket]:
    """`count` connections to the leader that never say a word (a failed one is skipped)."""
    host, _, port = address.rpartition(":")
    out = []
    for _ in range(count):
        with contextlib.suppress(OSError):
            out.append(socket.create_connection((host, int(port)), timeout=5))
    return out


@contextlib.contextmanager
def _dripping(address: str) -> Iterator[None]:
    """A connection that writes one byte of a plausible frame length every 0.3 s, forever."""
    host, _, port = address.rpartition(":")
    stop = threading.Event()
    sock = socket.create_connection((host, int(port)), timeout=5)

    def drip() -> None:
        with contextlib.suppress(OSError):
            while not stop.wait(0.3):
                sock.send(b"\x00")

    t = threading.Thread(target=drip, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=5)
        sock.close()


def _member(members: Members, node: str, out: dict[str, Any]) -> threading.Thread:
    def run() -> None:
        try:
            out[node] = member_link.connect(members.address, members.token, node, timeout=40)
        except LinkError as exc:
            out[node] = str(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_silent_and_dripping_connections_do_not_keep_a_member_out() -> None:
    """Before: one connection at a time, each given up to 30 s per read — a handful of silent
    connections (or one writing a byte now and then) outlast the join and the job fails."""
    members = Members(["n2", "n3"], host="127.0.0.1")
    joined: dict[str, Any] = {}
    silent = _silent(members.address, 6)
    try:
        with _dripping(members.address):
            threads = [_member(members, n, joined) for n in ("n2", "n3")]
            members.join(timeout_s=20)
            for t in threads:
                t.join(timeout=30)
        assert set(members.links) == {"n2", "n3"}
        assert all(isinstance(v, member_link.Link) for v in joined.values()), joined
    finally:
        for s in silent:
            s.close()
        for v in joined.values():
            if isinstance(v, member_link.Link):
                v.close()
        members.close(wait_s=1)


def test_a_flood_of_strangers_costs_a_bounded_number_of_handshakes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over MAX_HANDSHAKES at once, a connection is closed on arrival; the member whose
    connection was closed tries again and joins once the strangers' deadline passed."""
    monkeypatch.setattr(member_leader, "HANDSHAKE_TIMEOUT_S", 1.0, raising=False)
    limit = getattr(member_leader, "MAX_HANDSHAKES", 32)
    members = Members(["n2"], host="127.0.0.1")
    joined: dict[str, Any] = {}
    most = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal most
        while not stop.wait(0.01):
            most = max(most, sum(t.name == "vjob-member-handshake" for t in threading.enumerate()))

    counter = threading.Thread(target=count, daemon=True)
    counter.start()
    joiner = threading.Thread(target=members.join, kwargs={"timeout_s": 40}, daemon=True)
    joiner.start()
    silent = _silent(members.address, limit + 40)
    try:
        _member(members, "n2", joined).join(timeout=45)
        joiner.join(timeout=45)
        assert isinstance(joined.get("n2"), member_link.Link), joined
        assert set(members.links) == {"n2"}
        assert 0 < most <= limit
    finally:
        stop.set()
        counter.join(timeout=5)
        for s in silent:
            s.close()
        if isinstance(joined.get("n2"), member_link.Link):
            joined["n2"].close()
        members.close(wait_s=1)


def test_a_stranger_cannot_make_the_leader_buffer_a_megabyte_before_the_token() -> None:
    server, client = socket.socketpair()
    try:
        client.sendall((getattr(member_link, "HANDSHAKE_FRAME", 4096) + 1).to_bytes(4, "big"))
        client.shutdown(socket.SHUT_WR)  # nothing more comes: the frame's length alone must be refused
        with pytest.raises(LinkError, match="at most"):
            member_link._plain_recv(server, time.monotonic() + 5, "stranger")
    finally:
        server.close()
        client.close()


class _Tap:
    """A TCP relay between a member and its leader that keeps every byte it carries."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.seen = bytearray()
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        inner, _ = self.listener.accept()
        outer = socket.create_connection(self.target, timeout=10)
        for a, b in ((inner, outer), (outer, inner)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                with self._lock:
                    self.seen += data
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def test_the_member_link_carries_no_environment_and_no_arguments() -> None:
    """Before: the job's whole description, environment and arguments included, crossed the
    link in clear JSON. Now a member gets what it builds its VM from, and its parser accepts it."""
    secret_env, secret_arg = "hunter2-in-the-environment", "hunter3-on-the-command-line"
    members = Members(["n2"], host="127.0.0.1")
    tap = _Tap(members.address)
    got: list[dict[str, Any]] = []
    link_box: dict[str, Any] = {}

    def member() -> None:
        link = member_link.connect(tap.address, members.token, "n2", timeout=20)
        link_box["link"] = link
        while True:
            try:
                msg = link.recv(20)
            except LinkError:
                return
            got.append(msg)
            if msg.get("op") == "bye":
                return
            link.send({"ok": True, **({"same": True} if msg.get("op") == "workdir" else {})})

    t = threading.Thread(target=member, daemon=True)
    t.start()
    members.join(timeout_s=20)
    names = ["job9-0", "job9-1"]
    addresses = network.pilot_addresses("slurm", "9", names)
    job = {
        "args": [secret_arg],
        "env": {"API_TOKEN": secret_env, "PATH": "/usr/bin"},
        "uid": os.getuid(),
        "gid": os.getgid(),
        "user": "root",
        "home": "/root",
        "cwd": "/root/work",
        "hostname": "vm1",
        "network": network_of(addresses, 1, network.job_ssh_key("vjob-slurm-9")),
        "mounts": {"server": "10.0.9.254", "port": 2049, "exports": [{"export": "/home", "target": "/home"}]},
    }
    vm = MemberVM(members.links["n2"], "job9-1", "n2", "test:///default", 30)
    try:
        vm.define({"image": "debian12", "memory_mb": 512, "job": job})
        members.close(wait_s=1)
        t.join(timeout=20)
        wire = bytes(tap.seen)
        assert secret_env.encode() not in wire and secret_arg.encode() not in wire
        assert b"PRIVATE KEY" not in wire  # sealed, as before
        define = next(m for m in got if m.get("op") == "define")
        assert define["job"]["env"] == {} and define["job"]["args"] == []
        assert set(define["job"]) == {*member_leader.MEMBER_JOB_FIELDS, "env", "args"}
        assert json.dumps(define).count("hunter") == 0
        # the member's own parser takes what it now gets (the ssh key unsealed first, as it does)
        define["job"]["network"]["ssh_private"] = link_box["link"].unseal(define["job"]["network"]["ssh_private"])
        parsed = member_job(define["job"])
        assert parsed.env == {} and parsed.args == [] and parsed.cwd == "/root/work" and parsed.uid == os.getuid()
    finally:
        members.close(wait_s=1)
