"""A directory tree read out of an ext4 image someone else wrote, checked whole before one byte lands.

Why not `debugfs rdump`: it creates every entry with `O_CREAT|O_TRUNC` at `<dump>/<name>`, so a
symlink entry followed by a file of the same name writes through the link, a name holding
`../` lands outside the dump, and a sparse file or a file with many hard links is written in
full (terabytes from a small disk) before anyone can count. A job disk comes back from a guest
the user controls (and Saline receives one straight from the user), so its directories are
data: they are read with our own bounded reader (provisioning.ext4_image), and the whole tree
is refused — nothing written — on a name holding `/` or NUL, a name twice in one directory, a
directory reached twice (a loop), more than MAX_ENTRIES entries or MAX_DEPTH levels, or
apparent sizes (every regular file at its `i_size`, once per link, plus link targets) summing
over the limit.
Only directories, regular files and symbolic links are ever created; sockets, FIFOs and device
nodes are skipped and named. `Writer` creates entries relative to a directory descriptor with
`O_CREAT|O_EXCL|O_NOFOLLOW` under parents it made itself, so even a tree that lies (Saline's
stream from an unprivileged child, saline_bew.workdir) cannot make it follow a link.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TypeVar

from provisioning import ext4_image
from provisioning.ext4_image import CHUNK, Image, Inode, check_name, refuse, show
from vjob.errors import InputError

MAX_SKIPPED = 100
"""Skipped names (sockets, FIFOs, devices) kept to be named; the rest only count."""
MAX_DEPTH = 128
MAX_PATH_BYTES = 3072
"""A path under the tree's root, its names joined with `/`: within PATH_MAX (4096) with room for
where it is written (a deeper one made every later path operation fail with ENAMETOOLONG)."""
MAX_LINK_BYTES = 4095


def path_bytes(path: tuple[bytes, ...]) -> int:
    """The length of `path` written out (names and the `/` between them)."""
    return sum(map(len, path)) + len(path) - 1


@dataclass(frozen=True)
class Entry:
    """One thing to create: `path` under the tree's root (parents come first), `size` the
    apparent size of a file (holes and all), `target` a link's."""

    path: tuple[bytes, ...]
    kind: str
    mode: int
    size: int
    mtime_ns: int
    inode: int = 0
    target: bytes = b""


@dataclass
class Tree:
    entries: list[Entry] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    total_bytes: int = 0


def scan(image: Image, root: tuple[bytes, ...], limit_bytes: int) -> Tree:
    """Everything under `root` (a directory; missing or not one: an empty tree), checked whole:
    InputError on the first bad name, duplicate, loop, or when apparent sizes pass `limit_bytes`.
    Every name counts towards MAX_ENTRIES, skipped ones too (a million FIFOs are a million names
    held and inodes read), and only the first MAX_SKIPPED skipped names are kept."""
    tree = Tree()
    top = image.lookup(root)
    if top is None or top.kind != "dir":
        return tree
    seen_dirs = {top.number}
    stack: list[tuple[tuple[bytes, ...], Inode]] = [((), top)]
    names = 0
    while stack:
        path, directory = stack.pop()
        for name, number in image.listing(directory, show(root + path), ext4_image.MAX_ENTRIES - names):
            child = (*path, name)
            names += 1
            if names > ext4_image.MAX_ENTRIES:
                raise refuse(f"more than {ext4_image.MAX_ENTRIES} entries")
            inode = image.inode(number)
            if path_bytes(child) > MAX_PATH_BYTES:
                raise refuse(f"{show(child)}: a path over {MAX_PATH_BYTES} bytes")
            size = 0
            target = b""
            if inode.kind == "dir":
                if inode.number in seen_dirs:
                    raise refuse(f"directory {show(child)} reached twice (a loop)")
                if len(child) > MAX_DEPTH:
                    raise refuse(f"{show(child)}: deeper than {MAX_DEPTH} levels")
                seen_dirs.add(inode.number)
                stack.append((child, inode))
            elif inode.kind == "file":
                size = inode.size
            elif inode.kind == "link":
                target = image.contents(inode, MAX_LINK_BYTES)
                if not target or b"\0" in target:
                    raise refuse(f"link {show(child)}: an empty target or one holding NUL")
                size = len(target)
            else:
                if len(tree.skipped) < MAX_SKIPPED:
                    tree.skipped.append(show(child))
                continue
            tree.total_bytes += size
            if tree.total_bytes > limit_bytes:
                raise refuse(
                    f"its /work holds more than {limit_bytes} bytes (apparent sizes, every hard link and "
                    f"sparse file counted whole, reached at {show(child)})"
                )
            tree.entries.append(
                Entry(child, inode.kind, stat.S_IMODE(inode.mode), size, inode.mtime_ns, inode.number, target)
            )
    return tree


class Writer:
    """Creates entries under `dest` (an empty directory of the caller's own, opened here with
    O_NOFOLLOW), parents before children, each at most once, within `limit_bytes` in all: what
    it is given is checked again, so a lying source cannot make it follow a link or write more."""

    def __init__(self, dest: Path, limit_bytes: int) -> None:
        self.root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.budget = self.limit = limit_bytes
        self.dirs: dict[tuple[bytes, ...], tuple[int, int]] = {(): (0, 0)}
        self.seen: set[tuple[bytes, ...]] = set()
        self.current: tuple[int, Entry] | None = None
        self.written = 0

    def add(self, entry: Entry) -> None:
        self._close_file()
        if (
            not entry.path
            or len(entry.path) > MAX_DEPTH + 1
            or len(self.seen) >= ext4_image.MAX_ENTRIES
            or path_bytes(entry.path) > MAX_PATH_BYTES
        ):
            raise refuse(f"entry {show(entry.path)}: path length, depth or entry count out of bounds")
        for name in entry.path:
            check_name(name, show(entry.path))
        if entry.path[:-1] not in self.dirs or entry.path in self.seen:
            raise refuse(f"entry {show(entry.path)}: its directory was not made first, or it comes twice")
        self.seen.add(entry.path)
        rel = os.fsdecode(b"/".join(entry.path))
        if entry.kind == "dir":
            os.mkdir(rel, 0o700, dir_fd=self.root)
            self.dirs[entry.path] = (entry.mode, entry.mtime_ns)
        elif entry.kind == "link":
            if not 0 < len(entry.target) <= MAX_LINK_BYTES or b"\0" in entry.target:
                raise refuse(f"link {show(entry.path)}: an empty target, one over {MAX_LINK_BYTES} bytes or with NUL")
            self._spend(len(entry.target), entry)
            os.symlink(os.fsdecode(entry.target), rel, dir_fd=self.root)
            os.utime(rel, ns=(entry.mtime_ns, entry.mtime_ns), dir_fd=self.root, follow_symlinks=False)
        elif entry.kind == "file":
            self._spend(entry.size, entry)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            self.current = (os.open(rel, flags, 0o600, dir_fd=self.root), entry)
        else:
            raise refuse(f"entry {show(entry.path)}: kind {entry.kind[:20]!r}")

    def write(self, offset: int, data: bytes) -> None:
        """Bytes of the file last added, at `offset` within its size."""
        if self.current is None:
            raise refuse("file data with no file before it")
        fd, entry = self.current
        if offset < 0 or offset + len(data) > entry.size:
            raise refuse(f"file {show(entry.path)}: data at {offset}+{len(data)} past its size {entry.size}")
        self.written += len(data)
        if self.written > self.limit:
            raise refuse(f"more than {self.limit} bytes of file data (the limit)")
        os.pwrite(fd, data, offset)

    def _spend(self, size: int, entry: Entry) -> None:
        if size < 0 or size > self.budget:
            raise refuse(f"entry {show(entry.path)}: {size} bytes, over what is left of the limit ({self.budget})")
        self.budget -= size

    def _close_file(self) -> None:
        if self.current is not None:
            fd, entry = self.current
            self.current = None
            try:
                os.ftruncate(fd, entry.size)  # holes stay holes
                os.fchmod(fd, entry.mode & 0o777)
                os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
            finally:
                os.close(fd)

    def finish(self) -> None:
        """Directories get their modes and times last (their content changed them)."""
        self._close_file()
        for path in sorted(self.dirs, key=len, reverse=True):
            if path:
                mode, mtime_ns = self.dirs[path]
                rel = os.fsdecode(b"/".join(path))
                os.chmod(rel, (mode & 0o777) | 0o700, dir_fd=self.root, follow_symlinks=False)
                os.utime(rel, ns=(mtime_ns, mtime_ns), dir_fd=self.root, follow_symlinks=False)

    def close(self) -> None:
        if self.current is not None:
            os.close(self.current[0])
            self.current = None
        os.close(self.root)


def extract(image: Image, tree: Tree, dest: Path, limit_bytes: int) -> None:
    """Write a scanned tree under `dest` (an empty directory of the caller's)."""
    writer = Writer(dest, limit_bytes)
    try:
        for entry in tree.entries:
            writer.add(entry)
            if entry.kind == "file":
                for offset, data in image.chunks(image.inode(entry.inode)):
                    writer.write(offset, data)
        writer.finish()
    finally:
        writer.close()


# -- a tree as a stream: from an unprivileged reader to a privileged writer ----------------------
_MAX_HEADER = 64 << 10


def _frame(out: BinaryIO, header: dict[str, object], payload: bytes = b"") -> None:
    text = json.dumps(header).encode()
    out.write(struct.pack(">I", len(text)) + text + payload)


def send(fd: int, root: tuple[bytes, ...], limit_bytes: int, out: BinaryIO) -> None:
    """Read the image open at `fd`, scan it, then stream the tree to `out`: its entries and data
    and a `done` frame with what was skipped, or an `error` frame (the message) the moment
    anything is refused or unreadable (frames are written whole, so the reader sees one).
    Runs in a child that may no longer read the interpreter's own files (a user without access
    to its prefix): it imports nothing lazily (no codec lookups, modules loaded at import)."""
    try:
        image = Image(fd)
        tree = scan(image, root, limit_bytes)
        for entry in tree.entries:
            _frame(
                out,
                {
                    "entry": [
                        [p.hex() for p in entry.path],
                        entry.kind,
                        entry.mode,
                        entry.size,
                        entry.mtime_ns,
                        entry.target.hex(),
                    ]
                },
            )
            if entry.kind == "file":
                for offset, data in image.chunks(image.inode(entry.inode)):
                    _frame(out, {"data": offset, "n": len(data)}, data)
    except Exception as exc:  # noqa: BLE001 - said to the writer, whose InputError names it
        _error_frame(out, exc)
        return
    _frame(out, {"done": tree.skipped[:100]})


def _error_frame(out: BinaryIO, exc: Exception) -> None:
    why = str(exc) if isinstance(exc, InputError) else f"job disk: unreadable ({type(exc).__name__}: {exc})"
    _frame(out, {"error": why[:500]})


def send_small_file(fd: int, path: tuple[bytes, ...], most: int, out: BinaryIO) -> None:
    """One frame to `out`: `Image.small_file(path, most)` of the image open at `fd` (`file`: its
    bytes in hex, or null when it is missing, not a regular file or over `most`), or `error`."""
    try:
        content = Image(fd).small_file(path, most)
    except Exception as exc:  # noqa: BLE001 - said to the receiver, whose InputError names it
        _error_frame(out, exc)
        return
    _frame(out, {"file": None if content is None else content.hex()})


def receive_small_file(read: Callable[[int], bytes], most: int) -> bytes | None:
    """What `send_small_file` sent, checked again: at most `most` bytes, or None; InputError
    for its error frame or anything else."""
    header = _header(read)
    if "error" in header:
        raise InputError(str(header["error"])[:500])
    if "file" not in header:
        raise refuse("an unknown frame from the reader")
    value = header["file"]
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 2 * most:
        raise refuse("a bad file frame from the reader")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise refuse("a bad file frame from the reader") from None


def receive(read: Callable[[int], bytes], dest: Path, limit_bytes: int) -> list[str]:
    """Write what `send` streamed (read with `read(n)`, which returns fewer bytes only at the
    end) under `dest`; returns the skipped names. Every frame is checked: InputError otherwise."""
    writer = Writer(dest, limit_bytes)
    try:
        while True:
            header = _header(read)
            if "error" in header:
                raise InputError(str(header["error"])[:500])
            if "done" in header:
                writer.finish()
                skipped = header["done"]
                return [str(s)[:200] for s in skipped[:100]] if isinstance(skipped, list) else []
            if "data" in header:
                length = header.get("n")
                if not isinstance(header["data"], int) or not isinstance(length, int) or not 0 < length <= CHUNK:
                    raise refuse("a bad data frame from the reader")
                data = read(length)
                if len(data) != length:
                    raise refuse("the reader's stream ended inside a file")
                writer.write(header["data"], data)
            elif "entry" in header:
                writer.add(_entry(header["entry"]))
            else:
                raise refuse("an unknown frame from the reader")
    finally:
        writer.close()


def _header(read: Callable[[int], bytes]) -> dict[str, object]:
    size = read(4)
    if len(size) != 4 or not 2 <= struct.unpack(">I", size)[0] <= _MAX_HEADER:
        raise refuse("the reader's stream ended early or is garbled")
    text = read(struct.unpack(">I", size)[0])
    try:
        header = json.loads(text)
    except (ValueError, RecursionError):
        raise refuse("a garbled frame from the reader") from None
    if not isinstance(header, dict):
        raise refuse("a garbled frame from the reader")
    return header


def _entry(value: object) -> Entry:
    try:
        hex_path, kind, mode, size, mtime_ns, target = value  # type: ignore[misc]
        ints = (mode, size, mtime_ns)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ints) or not isinstance(target, str):
            raise ValueError
        path = tuple(bytes.fromhex(p) for p in hex_path)
        if not 0 <= mode <= 0o7777 or size < 0 or abs(mtime_ns) >= 2**63 or len(target) > 2 * MAX_LINK_BYTES:
            raise ValueError
        return Entry(path, str(kind), mode, size, mtime_ns, 0, bytes.fromhex(target))
    except (TypeError, ValueError):
        raise refuse("a bad entry frame from the reader") from None


# -- the reader in a child that became the disk's user ------------------------------------------
_PR_SET_DUMPABLE = 4
T = TypeVar("T")


def as_user(
    uid: int,
    gid: int,
    image_fd: int,
    work: Callable[[int, BinaryIO], None],
    consume: Callable[[Callable[[int], bytes]], T],
    *,
    timeout_s: int,
) -> T:
    """`work(image_fd, out)` in a forked child that became `uid`/`gid`, and what `consume(read)`
    makes here of what it wrote to `out`: how root reads a file system a user wrote without
    parsing it itself (a flaw of this reader then runs as that user, with no more than the user
    has: the image's descriptor, one pipe, no groups, /dev/null as its standard streams).

    The child is a fork (no exec: the interpreter may lie where the user cannot read, so `work`
    must import nothing), not dumpable (PR_SET_DUMPABLE 0 after setuid: the user's own processes
    cannot trace it or open its /proc files), and SIGALRM ends it after `timeout_s`. `consume`
    must check everything it is sent: InputError when it refuses, and when the child ended
    otherwise than with 0. A caller that is not root reads as itself (then `uid`/`gid` must be
    its own)."""
    if image_fd < 3:
        raise ValueError("as_user: the image must not be a standard stream")
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        raise
    if pid == 0:  # the child: never returns into the caller
        code = 1
        try:
            _become(uid, gid, (image_fd, write_end), timeout_s)
            with open(write_end, "wb", buffering=1 << 20) as out:
                work(image_fd, out)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    finished = False
    try:
        with open(read_end, "rb") as stream:
            result = consume(stream.read)
        finished = True
    finally:
        if not finished:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _pid, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise refuse(f"its reader ended with status {os.waitstatus_to_exitcode(status)}")
    return result


def _become(uid: int, gid: int, keep: tuple[int, int], timeout_s: int) -> None:
    """In the forked child: /dev/null as stdin, stdout and stderr, every descriptor but `keep`
    closed, the caller's signal handlers gone, then the user's ids only (SystemExit otherwise)."""
    null = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(null, std)
    low, high = sorted(keep)
    os.closerange(3, low)
    os.closerange(low + 1, high)
    os.closerange(high + 1, 1 << 20)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):
        signal.signal(signum, signal.SIG_DFL)
    signal.alarm(timeout_s)
    os.chdir("/")
    dropped = os.geteuid() == 0
    if dropped:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid or os.getegid() != gid:
        raise SystemExit(1)
    if dropped and os.getgroups() not in ([], [gid]):
        raise SystemExit(1)
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:  # whatever suid_dumpable says
        raise SystemExit(1)
