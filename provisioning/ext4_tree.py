"""A directory tree read out of an ext4 image someone else wrote, checked whole before one byte lands.

Why not `debugfs rdump`: it creates every entry with `O_CREAT|O_TRUNC` at `<dump>/<name>`, so a
symlink entry followed by a file of the same name writes through the link, a name holding
`../` lands outside the dump, and a sparse file or a file with many hard links is written in
full (terabytes from a small disk) before anyone can count. A job disk comes back from a guest
the user controls (and Saline receives one straight from the user), so its directories are
data: this module reads them itself (superblock, group descriptors, inodes, extents or block
maps, linear directory blocks: bounded, in Python, no C parser) and refuses the whole tree —
nothing written — on a name holding `/` or NUL, a name twice in one directory, a directory
reached twice (a loop), more than MAX_ENTRIES entries or MAX_DEPTH levels, or apparent sizes
(every regular file at its `i_size`, once per link, plus link targets) summing over the limit.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TypeVar

from vjob.errors import InputError

MAX_ENTRIES = 1 << 20
"""Entries (files, directories, links) in one tree: a working directory, not a file system."""
MAX_SKIPPED = 100
"""Skipped names (sockets, FIFOs, devices) kept to be named; the rest only count."""
MAX_DEPTH = 128
MAX_PATH_BYTES = 3072
"""A path under the tree's root, its names joined with `/`: within PATH_MAX (4096) with room for
where it is written (a deeper one made every later path operation fail with ENAMETOOLONG)."""
MAX_DIR_BYTES = 64 << 20
"""One directory's blocks (a directory of ~1M names); all directories: MAX_ALL_DIR_BYTES."""
MAX_ALL_DIR_BYTES = 128 << 20
MAX_LINK_BYTES = 4095
MAX_EXTENT_NODES = 1 << 16
"""Extent-tree and indirect blocks read in one tree: a crafted tree cannot make us read forever."""
CHUNK = 1 << 20
ROOT_INODE = 2
_EXTENTS_FL = 0x80000
_INLINE_DATA_FL = 0x10000000
_INCOMPAT_META_BG = 0x10
_INCOMPAT_64BIT = 0x80
_EXTENT_MAGIC = 0xF30A


def _refuse(what: str) -> InputError:
    return InputError(f"job disk: {what}; nothing of its /work was written")


def check_name(name: bytes, where: str) -> None:
    """A name we may create in a directory: not empty, at most 255 bytes, no `/`, no NUL, not
    `.` or `..` (a directory's own entries are skipped before this is asked)."""
    if not name or len(name) > 255 or b"/" in name or b"\0" in name or name in (b".", b".."):
        raise _refuse(f"entry {name[:80]!r} in {where}: a name may not be empty, '.', '..' or hold '/' or NUL")


def path_bytes(path: tuple[bytes, ...]) -> int:
    """The length of `path` written out (names and the `/` between them)."""
    return sum(map(len, path)) + len(path) - 1


def show(path: tuple[bytes, ...]) -> str:
    """A path of the tree as text for messages (bytes that are not UTF-8 escaped, bounded)."""
    return ascii("/".join(os.fsdecode(p) for p in path) or ".")[1:-1][:200]  # no codec to import: see send


@dataclass(frozen=True)
class Inode:
    number: int
    mode: int
    size: int
    flags: int
    block: bytes
    mtime_ns: int

    @property
    def kind(self) -> str:
        fmt = stat.S_IFMT(self.mode)
        return {stat.S_IFDIR: "dir", stat.S_IFREG: "file", stat.S_IFLNK: "link"}.get(fmt, "special")


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


class Image:
    """An ext4 file system in a raw image open at `fd` (read with pread, never written)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.image_bytes = os.fstat(fd).st_size
        sb = self._read(1024, 1024, "superblock")
        (magic,) = struct.unpack_from("<H", sb, 0x38)
        if magic != 0xEF53:
            raise _refuse("not an ext4 file system (bad superblock magic)")
        log_bs = struct.unpack_from("<I", sb, 0x18)[0]
        if log_bs > 6:
            raise _refuse(f"block size 1024<<{log_bs}: at most 64 KiB")
        self.bs = 1024 << log_bs
        self.inodes_count, blocks_lo = struct.unpack_from("<II", sb, 0)
        self.first_data_block = struct.unpack_from("<I", sb, 0x14)[0]
        self.inodes_per_group = struct.unpack_from("<I", sb, 0x28)[0]
        rev = struct.unpack_from("<I", sb, 0x4C)[0]
        self.inode_size = struct.unpack_from("<H", sb, 0x58)[0] if rev >= 1 else 128
        incompat = struct.unpack_from("<I", sb, 0x60)[0]
        wide = bool(incompat & _INCOMPAT_64BIT)
        self.blocks_count = blocks_lo | ((struct.unpack_from("<I", sb, 0x150)[0] << 32) if wide else 0)
        self.desc_size = struct.unpack_from("<H", sb, 0xFE)[0] if wide else 32
        if incompat & _INCOMPAT_META_BG:
            raise _refuse("meta_bg file systems are not read (a job disk is made without it)")
        if not 128 <= self.inode_size <= self.bs or self.inode_size & (self.inode_size - 1):
            raise _refuse(f"inode size {self.inode_size}")
        if self.desc_size < 32 or self.inodes_per_group == 0 or self.first_data_block > 1:
            raise _refuse("a superblock no mkfs.ext4 writes")
        if self.blocks_count * self.bs > self.image_bytes:  # fs_bytes is the copy-back's limit: at most the disk
            raise _refuse(f"the superblock claims {self.blocks_count} blocks of {self.bs} bytes, more than the image")
        self.wide = wide and self.desc_size >= 64
        self.nodes_read = 0
        self.dir_bytes = 0

    @property
    def fs_bytes(self) -> int:
        """What the file system can hold at most (its blocks): without holes or hard links,
        no tree on it is bigger."""
        return self.blocks_count * self.bs

    def _read(self, offset: int, length: int, what: str) -> bytes:
        if offset < 0 or offset + length > self.image_bytes:
            raise _refuse(f"{what} at byte {offset} lies outside the image")
        data = os.pread(self.fd, length, offset)
        if len(data) != length:
            raise _refuse(f"{what}: short read at byte {offset}")
        return data

    def inode_offset(self, number: int) -> int:
        """Where inode `number` lies in the image (its group's descriptor says)."""
        if not 1 <= number <= self.inodes_count:
            raise _refuse(f"inode {number} out of range")
        group, index = divmod(number - 1, self.inodes_per_group)
        desc = self._read((self.first_data_block + 1) * self.bs + group * self.desc_size, self.desc_size, "descriptor")
        table = struct.unpack_from("<I", desc, 8)[0] | (
            (struct.unpack_from("<I", desc, 0x28)[0] << 32) if self.wide else 0
        )
        return table * self.bs + index * self.inode_size

    def inode(self, number: int) -> Inode:
        raw = self._read(self.inode_offset(number), self.inode_size, f"inode {number}")
        mode, size_lo, _atime, _ctime, mtime = struct.unpack_from("<HxxIIII", raw, 0)
        flags = struct.unpack_from("<I", raw, 0x20)[0]
        size = size_lo | (struct.unpack_from("<I", raw, 0x6C)[0] << 32)
        seconds, nsec = struct.unpack("<i", struct.pack("<I", mtime))[0], 0
        if self.inode_size > 128 and struct.unpack_from("<H", raw, 0x80)[0] >= 12:
            extra = struct.unpack_from("<I", raw, 0x88)[0]
            seconds += (extra & 3) << 32
            nsec = extra >> 2 if extra >> 2 < 10**9 else 0
        mtime_ns = min(max(seconds * 10**9 + nsec, -(2**62)), 2**62)  # epoch bits can pass what utime takes
        return Inode(number, mode, size, flags, raw[0x28:0x28 + 60], mtime_ns)  # fmt: skip

    def _runs(self, inode: Inode) -> Iterator[tuple[int, int, int, bool]]:
        """(first logical block, first physical block, blocks, written) of the inode's data."""
        if inode.flags & _INLINE_DATA_FL:
            raise _refuse(f"inode {inode.number}: inline data is not read (a job disk is made without it)")
        if inode.flags & _EXTENTS_FL:
            yield from self._extent_runs(inode.block, inode.number, None, [0])
        else:
            last = -(-inode.size // self.bs)
            yield from self._map_runs(struct.unpack("<15I", inode.block), inode.number, last)

    def _extent_runs(
        self, node: bytes, number: int, depth: int | None, next_free: list[int]
    ) -> Iterator[tuple[int, int, int, bool]]:
        """The leaves' extents in logical order, as ext4 keeps them: each level one below its
        parent's (no cycle), every extent one block at least and after the one before
        (`next_free[0]`, its first free logical block), so the caller may stop at the file's
        size and an index that names one leaf many times is refused at its second visit (it
        made the reader walk every extent of that leaf again, up to MAX_EXTENT_NODES times)."""
        magic, entries, most, level = struct.unpack_from("<HHHH", node, 0)
        if magic != _EXTENT_MAGIC or entries > most or 12 + 12 * entries > len(node) or level > 5:
            raise _refuse(f"inode {number}: a damaged extent tree")
        if depth is not None and level != depth:
            raise _refuse(f"inode {number}: extent tree levels out of order")
        for i in range(entries):
            at = 12 + 12 * i
            if level == 0:
                logical, length, hi, lo = struct.unpack_from("<IHHI", node, at)
                written = length <= 32768
                count = length if written else length - 32768
                if count == 0 or logical < next_free[0]:
                    raise _refuse(f"inode {number}: extents empty, out of order or overlapping (at block {logical})")
                next_free[0] = logical + count
                yield logical, lo | (hi << 32), count, written
            else:
                _logical, lo, hi = struct.unpack_from("<IIH", node, at)
                self._count_node(number)
                yield from self._extent_runs(self._block(lo | (hi << 32), number), number, level - 1, next_free)

    def _map_runs(self, pointers: tuple[int, ...], number: int, last: int) -> Iterator[tuple[int, int, int, bool]]:
        """An ext2/3 block map: 12 direct blocks, then single, double and triple indirect."""
        per = self.bs // 4
        for i in range(min(12, last)):
            if pointers[i]:
                yield i, pointers[i], 1, True
        start, span = 12, 1
        for level, top in enumerate(pointers[12:15]):
            span *= per
            if start >= last:
                return
            if top:
                yield from self._indirect(top, level, start, last, number)
            start += span

    def _indirect(
        self, block: int, level: int, start: int, last: int, number: int
    ) -> Iterator[tuple[int, int, int, bool]]:
        self._count_node(number)
        per = self.bs // 4
        span = per**level
        for i, target in enumerate(struct.unpack(f"<{per}I", self._block(block, number))):
            first = start + i * span
            if first >= last:
                return
            if target and level == 0:
                yield first, target, 1, True
            elif target:
                yield from self._indirect(target, level - 1, first, last, number)

    def _count_node(self, number: int) -> None:
        self.nodes_read += 1
        if self.nodes_read > MAX_EXTENT_NODES:
            raise _refuse(f"inode {number}: more than {MAX_EXTENT_NODES} mapping blocks read")

    def _block(self, block: int, number: int) -> bytes:
        if not 0 < block < self.blocks_count:
            raise _refuse(f"inode {number}: block {block} outside the file system")
        return self._read(block * self.bs, self.bs, f"inode {number}'s block")

    def chunks(self, inode: Inode) -> Iterator[tuple[int, bytes]]:
        """(offset, bytes) of what the file holds within its size; holes are not yielded. At
        most `size` bytes in all: overlapping extents are refused, not written twice. The runs
        come in logical order (`_extent_runs`, `_map_runs`): the first past the size ends it."""
        given = 0
        for logical, physical, count, written in self._runs(inode):
            offset = logical * self.bs
            if offset >= inode.size:
                break
            if not written:
                continue
            length = min(count * self.bs, inode.size - offset)
            if physical <= 0 or physical * self.bs + length > self.fs_bytes:
                raise _refuse(f"inode {inode.number}: data at block {physical} outside the file system")
            given += length
            if given > inode.size:
                raise _refuse(f"inode {inode.number}: extents overlap (more data than its size {inode.size})")
            for at in range(0, length, CHUNK):
                n = min(CHUNK, length - at)
                yield offset + at, self._read(physical * self.bs + at, n, f"inode {inode.number}'s data")

    def contents(self, inode: Inode, most: int) -> bytes:
        """The whole content of a small file, directory or link (holes read as zeros)."""
        if inode.size > most:
            raise _refuse(f"inode {inode.number}: {inode.size} bytes, at most {most} read")
        if stat.S_ISLNK(inode.mode) and inode.size < 60 and not inode.flags & _INLINE_DATA_FL:
            return inode.block[: inode.size]  # a fast symlink: the target is in the inode
        data = bytearray(inode.size)
        for offset, chunk in self.chunks(inode):
            data[offset : offset + len(chunk)] = chunk
        return bytes(data)

    def listing(self, inode: Inode, where: str, most: int | None = None) -> list[tuple[bytes, int]]:
        """(name, inode) of a directory, without `.` and `..`, each name checked, none twice, at
        most `most` (MAX_ENTRIES by default; scan passes what is left of it): 64 MiB of 12-byte
        records would otherwise be some 5 million names held at once before anyone counted."""
        most = MAX_ENTRIES if most is None else most
        if inode.size % self.bs:
            raise _refuse(f"directory {where}: size {inode.size} is not whole blocks")
        self.dir_bytes += inode.size
        if self.dir_bytes > MAX_ALL_DIR_BYTES:
            raise _refuse(f"directories over {MAX_ALL_DIR_BYTES >> 20} MiB in all")
        data = self.contents(inode, MAX_DIR_BYTES)
        found: list[tuple[bytes, int]] = []
        names: set[bytes] = set()
        for base in range(0, len(data), self.bs):
            at = 0
            while at < self.bs:
                if at + 8 > self.bs:
                    raise _refuse(f"directory {where}: a damaged block")
                number, rec_len, name_len = struct.unpack_from("<IHB", data, base + at)
                if self.bs == 65536 and rec_len in (0, 65535):
                    rec_len = 65536
                if rec_len < 8 + name_len or rec_len % 4 or at + rec_len > self.bs:
                    raise _refuse(f"directory {where}: a damaged entry (record length {rec_len})")
                name = data[base + at + 8 : base + at + 8 + name_len]
                at += rec_len
                if number == 0 or name in (b".", b".."):
                    continue
                check_name(name, where)
                if name in names:
                    raise _refuse(f"directory {where}: the name {name[:80]!r} twice")
                if len(found) >= most:
                    raise _refuse(f"more than {MAX_ENTRIES} entries (directory {where})")
                names.add(name)
                found.append((name, number))
        return found

    def lookup(self, path: tuple[bytes, ...]) -> Inode | None:
        """The inode at `path` from the root, or None where a component is missing or a file
        stands where a directory should."""
        inode = self.inode(ROOT_INODE)
        for depth, name in enumerate(path):
            if inode.kind != "dir":
                return None
            entries = dict(self.listing(inode, "/" + show(path[:depth]).lstrip(".")))
            if name not in entries:
                return None
            inode = self.inode(entries[name])
        return inode

    def small_file(self, path: tuple[bytes, ...], most: int) -> bytes | None:
        """A regular file's content, or None when it is missing, not regular or over `most`."""
        inode = self.lookup(path)
        if inode is None or inode.kind != "file" or inode.size > most:
            return None
        return self.contents(inode, most)


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
        for name, number in image.listing(directory, show(root + path), MAX_ENTRIES - names):
            child = (*path, name)
            names += 1
            if names > MAX_ENTRIES:
                raise _refuse(f"more than {MAX_ENTRIES} entries")
            inode = image.inode(number)
            if path_bytes(child) > MAX_PATH_BYTES:
                raise _refuse(f"{show(child)}: a path over {MAX_PATH_BYTES} bytes")
            size = 0
            target = b""
            if inode.kind == "dir":
                if inode.number in seen_dirs:
                    raise _refuse(f"directory {show(child)} reached twice (a loop)")
                if len(child) > MAX_DEPTH:
                    raise _refuse(f"{show(child)}: deeper than {MAX_DEPTH} levels")
                seen_dirs.add(inode.number)
                stack.append((child, inode))
            elif inode.kind == "file":
                size = inode.size
            elif inode.kind == "link":
                target = image.contents(inode, MAX_LINK_BYTES)
                if not target or b"\0" in target:
                    raise _refuse(f"link {show(child)}: an empty target or one holding NUL")
                size = len(target)
            else:
                if len(tree.skipped) < MAX_SKIPPED:
                    tree.skipped.append(show(child))
                continue
            tree.total_bytes += size
            if tree.total_bytes > limit_bytes:
                raise _refuse(
                    f"its /work holds more than {limit_bytes} bytes (apparent sizes, every hard link and "
                    f"sparse file counted whole, reached at {show(child)})"
                )
            tree.entries.append(Entry(child, inode.kind, stat.S_IMODE(inode.mode), size, inode.mtime_ns,
                                      inode.number, target))  # fmt: skip
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
        if (not entry.path or len(entry.path) > MAX_DEPTH + 1 or len(self.seen) >= MAX_ENTRIES
                or path_bytes(entry.path) > MAX_PATH_BYTES):  # fmt: skip
            raise _refuse(f"entry {show(entry.path)}: path length, depth or entry count out of bounds")
        for name in entry.path:
            check_name(name, show(entry.path))
        if entry.path[:-1] not in self.dirs or entry.path in self.seen:
            raise _refuse(f"entry {show(entry.path)}: its directory was not made first, or it comes twice")
        self.seen.add(entry.path)
        rel = os.fsdecode(b"/".join(entry.path))
        if entry.kind == "dir":
            os.mkdir(rel, 0o700, dir_fd=self.root)
            self.dirs[entry.path] = (entry.mode, entry.mtime_ns)
        elif entry.kind == "link":
            if not 0 < len(entry.target) <= MAX_LINK_BYTES or b"\0" in entry.target:
                raise _refuse(f"link {show(entry.path)}: an empty target, one over {MAX_LINK_BYTES} bytes or with NUL")
            self._spend(len(entry.target), entry)
            os.symlink(os.fsdecode(entry.target), rel, dir_fd=self.root)
            os.utime(rel, ns=(entry.mtime_ns, entry.mtime_ns), dir_fd=self.root, follow_symlinks=False)
        elif entry.kind == "file":
            self._spend(entry.size, entry)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            self.current = (os.open(rel, flags, 0o600, dir_fd=self.root), entry)
        else:
            raise _refuse(f"entry {show(entry.path)}: kind {entry.kind[:20]!r}")

    def write(self, offset: int, data: bytes) -> None:
        """Bytes of the file last added, at `offset` within its size."""
        if self.current is None:
            raise _refuse("file data with no file before it")
        fd, entry = self.current
        if offset < 0 or offset + len(data) > entry.size:
            raise _refuse(f"file {show(entry.path)}: data at {offset}+{len(data)} past its size {entry.size}")
        self.written += len(data)
        if self.written > self.limit:
            raise _refuse(f"more than {self.limit} bytes of file data (the limit)")
        os.pwrite(fd, data, offset)

    def _spend(self, size: int, entry: Entry) -> None:
        if size < 0 or size > self.budget:
            raise _refuse(f"entry {show(entry.path)}: {size} bytes, over what is left of the limit ({self.budget})")
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
            _frame(out, {"entry": [[p.hex() for p in entry.path], entry.kind, entry.mode, entry.size,
                                   entry.mtime_ns, entry.target.hex()]})  # fmt: skip
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
        raise _refuse("an unknown frame from the reader")
    value = header["file"]
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 2 * most:
        raise _refuse("a bad file frame from the reader")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise _refuse("a bad file frame from the reader") from None


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
                    raise _refuse("a bad data frame from the reader")
                data = read(length)
                if len(data) != length:
                    raise _refuse("the reader's stream ended inside a file")
                writer.write(header["data"], data)
            elif "entry" in header:
                writer.add(_entry(header["entry"]))
            else:
                raise _refuse("an unknown frame from the reader")
    finally:
        writer.close()


def _header(read: Callable[[int], bytes]) -> dict[str, object]:
    size = read(4)
    if len(size) != 4 or not 2 <= struct.unpack(">I", size)[0] <= _MAX_HEADER:
        raise _refuse("the reader's stream ended early or is garbled")
    text = read(struct.unpack(">I", size)[0])
    try:
        header = json.loads(text)
    except (ValueError, RecursionError):
        raise _refuse("a garbled frame from the reader") from None
    if not isinstance(header, dict):
        raise _refuse("a garbled frame from the reader")
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
        raise _refuse("a bad entry frame from the reader") from None


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
        raise _refuse(f"its reader ended with status {os.waitstatus_to_exitcode(status)}")
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
