"""A caller of the node service running as another user, for the tests: a real process whose uid
the kernel reports through SO_PEERCRED, driven line by line over its stdin and stdout.

Why a separate process under /usr/bin/python3 and only the standard library: the venv's
interpreter may live where `nobody` cannot read, and the peer must not be pytest forked (the
test keeps talking to it while it holds connections open, e.g. for the per-uid limit).

Commands (one per stdin line) → one stdout line each:
  open                 → "opened N"  (a new connection, kept)
  send N JSON          → the answer line, or "EOF", or "ERROR reason"
  drip N SECONDS JSON  → sends the line a byte at a time, SECONDS apart; "cut after S" when the
                         service closed it first, else the answer line
  read N               → the next line the service sends on N unasked (a refusal), or "EOF"
  wait N               → "EOF after S" when the service closes connection N (else "open after S")
  close N              → "closed N"
"""

from __future__ import annotations

import pwd
import subprocess
from pathlib import Path

SCRIPT = r"""
import socket, sys, time
path = sys.argv[1]
conns = {}
count = 0

def answer(sock):
    buf = b""
    while not buf.endswith(b"\n"):
        try:
            chunk = sock.recv(65536)
        except OSError as exc:
            return "ERROR " + str(exc)
        if not chunk:
            return "EOF" if not buf else buf.decode()
        buf += chunk
    return buf.decode().strip()

for raw in sys.stdin:
    word, _, rest = raw.strip().partition(" ")
    try:
        if word == "open":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(30)
            s.connect(path)
            conns[count] = s
            out = "opened %d" % count
            count += 1
        elif word == "send":
            n, _, line = rest.partition(" ")
            conns[int(n)].sendall(line.encode() + b"\n")
            out = answer(conns[int(n)])
        elif word == "drip":
            n, secs, line = rest.split(" ", 2)
            s, start, out = conns[int(n)], time.monotonic(), None
            for byte in line.encode() + b"\n":
                try:
                    s.sendall(bytes([byte]))
                except OSError:
                    out = "cut after %.2f" % (time.monotonic() - start)
                    break
                time.sleep(float(secs))
            out = out or answer(s)
            if out in ("EOF",) or out.startswith("ERROR"):
                out = "cut after %.2f" % (time.monotonic() - start)
        elif word == "read":
            out = answer(conns[int(rest)])
        elif word == "wait":
            s, start = conns[int(rest)], time.monotonic()
            got = answer(s)
            out = ("EOF after %.2f" if got in ("EOF",) or got.startswith("ERROR") else "open after %.2f") % (
                time.monotonic() - start)
        elif word == "close":
            conns.pop(int(rest)).close()
            out = "closed " + rest
        else:
            out = "ERROR unknown command"
    except Exception as exc:
        out = "ERROR %s: %s" % (type(exc).__name__, exc)
    sys.stdout.write(out + "\n")
    sys.stdout.flush()
"""


class Peer:
    """One peer process as `user` talking to the service at `socket_path`."""

    def __init__(self, user: str, socket_path: Path) -> None:
        entry = pwd.getpwnam(user)
        self.uid = entry.pw_uid
        self.proc = subprocess.Popen(
            ["/usr/bin/python3", "-c", SCRIPT, str(socket_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            user=entry.pw_uid,
            group=entry.pw_gid,
            extra_groups=[],
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )

    def ask(self, command: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
