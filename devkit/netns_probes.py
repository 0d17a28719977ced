"""Probes run inside network namespaces by the tunnel's tests and bench (devkit/vxlan_hosts.py):
an ICMP ping, a TCP server and sender (digest-checked, timed), a frame counter on a raw socket,
and a VXLAN datagram built by hand (a spoofer's), sent by root or by an ordinary user.

Why a module of its own with the standard library only: every probe is a process started with
`ip netns exec … python -m devkit.netns_probes`, dozens per test; without the project's imports
one starts in a tenth of a second instead of two under load.

    python -m devkit.netns_probes ping DST COUNT
    python -m devkit.netns_probes serve IP PORT [yes|no]      # "ready", then at SIGTERM {"served"}
    python -m devkit.netns_probes send IP PORT BYTES SEED
    python -m devkit.netns_probes sniff IFACE HEX[,HEX...]    # "ready", then at SIGTERM the counts
    python -m devkit.netns_probes inject DST PORT VNI SRC_IP SRC_PORT MARKER
    python -m devkit.netns_probes inject-user DST PORT VNI MARKER USER
    python -m devkit.netns_probes inject-raw DST PORT VNI FORGED_SRC SRC_PORT MARKER
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import random
import signal
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003
MARK_TYPE = 0x88B5
"""IEEE's local experimental EtherType: the spoofer's inner frames."""


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF


def _ping(dst: str, count: str) -> dict:
    """ICMP echo `count` times (a raw socket: the namespaces have no ping binary)."""
    ident, replies = os.getpid() & 0xFFFF, 0
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as s:
        s.settimeout(0.5)
        for seq in range(int(count)):
            body = struct.pack("!BBHHH", 8, 0, 0, ident, seq) + b"vjob-ping"
            s.sendto(body[:2] + struct.pack("!H", _checksum(body)) + body[4:], (dst, 0))
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                try:
                    data, peer = s.recvfrom(2048)
                except TimeoutError:
                    continue
                head = (data[0] & 0x0F) * 4
                kind, _, _, rid, rseq = struct.unpack("!BBHHH", data[head : head + 8])
                if peer[0] == dst and kind == 0 and (rid, rseq) == (ident, seq):
                    replies += 1
                    break
    return {"ok": replies == int(count), "replies": replies, "sent": int(count)}


def _serve(ip: str, port: str, digest_too: str = "yes") -> None:
    """Answer every connection with the size and sha256 of what it sent (the size only with
    `digest_too` = "no": a bench's sink, bound by the network rather than by hashing); at SIGTERM,
    say how many connections it served."""
    stop, served = [False], [0]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((ip, int(port)))
        srv.listen(4)
        srv.settimeout(0.2)
        print("ready", flush=True)
        while not stop[0]:
            try:
                conn, _ = srv.accept()
            except (TimeoutError, InterruptedError):
                continue
            with conn:
                conn.settimeout(30)
                digest, size, buf = hashlib.sha256(), 0, bytearray(1 << 20)
                view = memoryview(buf)
                while got := conn.recv_into(buf):
                    if digest_too != "no":
                        digest.update(view[:got])
                    size += got
                said = {"bytes": size, "sha256": digest.hexdigest() if digest_too != "no" else ""}
                conn.sendall(json.dumps(said).encode())
                served[0] += 1
    print(json.dumps({"served": served[0]}), flush=True)


def _send(ip: str, port: str, size: str, seed: str) -> dict:
    """Send `size` seeded bytes, read the server's digest: {ok, bytes, seconds, mb_s}."""
    data = random.Random(int(seed)).randbytes(int(size))
    t0 = time.perf_counter()
    try:
        with socket.create_connection((ip, int(port)), timeout=10) as s:
            view = memoryview(data)
            for i in range(0, len(data), 1 << 20):
                s.sendall(view[i : i + (1 << 20)])
            s.shutdown(socket.SHUT_WR)
            said = json.loads(s.recv(4096) or b"{}")
    except OSError as exc:
        return {"ok": False, "error": type(exc).__name__}
    seconds = time.perf_counter() - t0
    digest_ok = said.get("sha256") in ("", hashlib.sha256(data).hexdigest())  # "": a sink that does not hash
    ok = said.get("bytes") == len(data) and digest_ok
    return {"ok": ok, "bytes": len(data), "seconds": round(seconds, 4), "mb_s": round(len(data) / seconds / 1e6, 2)}


def _sniff(iface: str, watch: str) -> None:
    """Count the frames `iface` receives until SIGTERM: those carrying each marker (`watch`:
    comma-separated hex strings, each searched in the whole frame) and all of them."""
    markers = [bytes.fromhex(m) for m in watch.split(",") if m]
    counts = dict.fromkeys(watch.split(","), 0)
    seen = [0]
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL)) as s:
        s.bind((iface, 0))
        s.settimeout(0.2)
        print("ready", flush=True)
        while not stop[0]:
            try:
                frame, where = s.recvfrom(65536)
            except (TimeoutError, InterruptedError):
                continue
            if where[2] == socket.PACKET_OUTGOING:  # what this namespace sends itself
                continue
            seen[0] += 1
            for text, raw in zip(counts, markers, strict=True):
                if raw in frame:
                    counts[text] += 1
    print(json.dumps({"frames": seen[0], "markers": counts}), flush=True)


def vxlan_datagram(vni: int, marker: str) -> bytes:
    """A VXLAN header (I flag, `vni`) and an inner broadcast frame of MARK_TYPE carrying `marker`:
    a bridge that takes it in floods it to every port (a sniffer finds `marker`'s bytes)."""
    inner = b"\xff" * 6 + bytes.fromhex("020000000001") + struct.pack("!H", MARK_TYPE) + marker.encode()
    return struct.pack("!BBHI", 0x08, 0, 0, vni << 8) + inner.ljust(60, b"\0")


def _inject(dst: str, port: str, vni: str, src_ip: str, src_port: str, marker: str) -> dict:
    """Send three hand-made VXLAN datagrams to dst:port (as root), from src_ip:src_port when given."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        if src_ip or int(src_port):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((src_ip, int(src_port)))
        for _ in range(3):
            s.sendto(vxlan_datagram(int(vni), marker), (dst, int(port)))
            time.sleep(0.05)
        return {"sent": 3, "from": list(s.getsockname()), "uid": os.getuid()}


def _inject_unprivileged(dst: str, port: str, vni: str, marker: str, user: str) -> dict:
    """The same sent by `user` from the port the kernel gives it, or from a privileged one it
    asks for (refused: EACCES)."""
    account = pwd.getpwnam(user)
    os.setgroups([])
    os.setgid(account.pw_gid)
    os.setuid(account.pw_uid)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind(("", 800))
            privileged = True
        except PermissionError:
            privileged = False
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(3):
            s.sendto(vxlan_datagram(int(vni), marker), (dst, int(port)))
            time.sleep(0.05)
        return {"sent": 3, "from": list(s.getsockname()), "uid": os.getuid(), "bound_privileged": privileged}


def _inject_raw(dst: str, port: str, vni: str, forged: str, src_port: str, marker: str) -> dict:
    """Three hand-made VXLAN datagrams with a forged source address (`forged`, not this
    namespace's), IP header and all (a raw socket: what a guest's root can do on a LAN)."""
    payload = vxlan_datagram(int(vni), marker)
    udp = struct.pack("!HHHH", int(src_port), int(port), 8 + len(payload), 0) + payload  # no UDP checksum: allowed
    head = struct.pack(
        "!BBHHHBBH4s4s",
        0x45,
        0,
        20 + len(udp),
        0x7A7A,
        0,
        64,
        socket.IPPROTO_UDP,
        0,
        socket.inet_aton(forged),
        socket.inet_aton(dst),
    )
    head = head[:10] + struct.pack("!H", _checksum(head)) + head[12:]
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as s:
        for _ in range(3):
            s.sendto(head + udp, (dst, 0))
            time.sleep(0.05)
    return {"sent": 3, "from": [forged, int(src_port)]}


def _probe(kind: str, args: list[str]) -> None:
    if kind == "serve":
        _serve(*args)
    elif kind == "sniff":
        _sniff(*args)
    else:
        fn = {
            "ping": _ping,
            "send": _send,
            "inject": _inject,
            "inject-user": _inject_unprivileged,
            "inject-raw": _inject_raw,
        }[kind]
        print(json.dumps(fn(*args)))


if __name__ == "__main__":
    _probe(sys.argv[1], sys.argv[2:])
