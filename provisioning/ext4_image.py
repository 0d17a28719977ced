"""The ext4 file system of a raw image someone else wrote, read with bounds: inodes, their data
and directories, never trusted and never written.

Why our own reader (superblock, group descriptors, inodes, extents or block maps, linear
directory blocks: bounded, in Python, no C parser): a job disk comes back from a guest the
user controls, so every number in it is data. Each read is checked to lie inside the image,
each mapping walk is bounded (MAX_EXTENT_NODES), each directory's names are checked and
counted as they are read (MAX_ENTRIES, MAX_DIR_BYTES), and the first thing out of bounds
refuses the whole disk. What is made of the tree read is `ext4_tree`'s.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from vjob.errors import InputError

MAX_ENTRIES = 1 << 20
"""Entries (files, directories, links) in one tree: a working directory, not a file system."""
MAX_DIR_BYTES = 64 << 20
"""One directory's blocks (a directory of ~1M names); all directories: MAX_ALL_DIR_BYTES."""
MAX_ALL_DIR_BYTES = 128 << 20
MAX_EXTENT_NODES = 1 << 16
"""Extent-tree and indirect blocks read in one tree: a crafted tree cannot make us read forever."""
CHUNK = 1 << 20
ROOT_INODE = 2
_EXTENTS_FL = 0x80000
_INLINE_DATA_FL = 0x10000000
_INCOMPAT_META_BG = 0x10
_INCOMPAT_64BIT = 0x80
_EXTENT_MAGIC = 0xF30A


def refuse(what: str) -> InputError:
    """The refusal of the whole disk for `what`: nothing of it is written."""
    return InputError(f"job disk: {what}; nothing of its /work was written")


def check_name(name: bytes, where: str) -> None:
    """A name we may create in a directory: not empty, at most 255 bytes, no `/`, no NUL, not
    `.` or `..` (a directory's own entries are skipped before this is asked)."""
    if not name or len(name) > 255 or b"/" in name or b"\0" in name or name in (b".", b".."):
        raise refuse(f"entry {name[:80]!r} in {where}: a name may not be empty, '.', '..' or hold '/' or NUL")


def show(path: tuple[bytes, ...]) -> str:
    """A path of the tree as text for messages (bytes that are not UTF-8 escaped, bounded)."""
    return ascii("/".join(os.fsdecode(p) for p in path) or ".")[1:-1][:200]  # no codec to import: see ext4_tree.send


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


class Image:
    """An ext4 file system in a raw image open at `fd` (read with pread, never written)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.image_bytes = os.fstat(fd).st_size
        sb = self._read(1024, 1024, "superblock")
        (magic,) = struct.unpack_from("<H", sb, 0x38)
        if magic != 0xEF53:
            raise refuse("not an ext4 file system (bad superblock magic)")
        log_bs = struct.unpack_from("<I", sb, 0x18)[0]
        if log_bs > 6:
            raise refuse(f"block size 1024<<{log_bs}: at most 64 KiB")
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
            raise refuse("meta_bg file systems are not read (a job disk is made without it)")
        if not 128 <= self.inode_size <= self.bs or self.inode_size & (self.inode_size - 1):
            raise refuse(f"inode size {self.inode_size}")
        if self.desc_size < 32 or self.inodes_per_group == 0 or self.first_data_block > 1:
            raise refuse("a superblock no mkfs.ext4 writes")
        if self.blocks_count * self.bs > self.image_bytes:  # fs_bytes is the copy-back's limit: at most the disk
            raise refuse(f"the superblock claims {self.blocks_count} blocks of {self.bs} bytes, more than the image")
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
            raise refuse(f"{what} at byte {offset} lies outside the image")
        data = os.pread(self.fd, length, offset)
        if len(data) != length:
            raise refuse(f"{what}: short read at byte {offset}")
        return data

    def inode_offset(self, number: int) -> int:
        """Where inode `number` lies in the image (its group's descriptor says)."""
        if not 1 <= number <= self.inodes_count:
            raise refuse(f"inode {number} out of range")
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
        return Inode(number, mode, size, flags, raw[0x28 : 0x28 + 60], mtime_ns)

    def _runs(self, inode: Inode) -> Iterator[tuple[int, int, int, bool]]:
        """(first logical block, first physical block, blocks, written) of the inode's data."""
        if inode.flags & _INLINE_DATA_FL:
            raise refuse(f"inode {inode.number}: inline data is not read (a job disk is made without it)")
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
            raise refuse(f"inode {number}: a damaged extent tree")
        if depth is not None and level != depth:
            raise refuse(f"inode {number}: extent tree levels out of order")
        for i in range(entries):
            at = 12 + 12 * i
            if level == 0:
                logical, length, hi, lo = struct.unpack_from("<IHHI", node, at)
                written = length <= 32768
                count = length if written else length - 32768
                if count == 0 or logical < next_free[0]:
                    raise refuse(f"inode {number}: extents empty, out of order or overlapping (at block {logical})")
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
            raise refuse(f"inode {number}: more than {MAX_EXTENT_NODES} mapping blocks read")

    def _block(self, block: int, number: int) -> bytes:
        if not 0 < block < self.blocks_count:
            raise refuse(f"inode {number}: block {block} outside the file system")
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
                raise refuse(f"inode {inode.number}: data at block {physical} outside the file system")
            given += length
            if given > inode.size:
                raise refuse(f"inode {inode.number}: extents overlap (more data than its size {inode.size})")
            for at in range(0, length, CHUNK):
                n = min(CHUNK, length - at)
                yield offset + at, self._read(physical * self.bs + at, n, f"inode {inode.number}'s data")

    def contents(self, inode: Inode, most: int) -> bytes:
        """The whole content of a small file, directory or link (holes read as zeros)."""
        if inode.size > most:
            raise refuse(f"inode {inode.number}: {inode.size} bytes, at most {most} read")
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
            raise refuse(f"directory {where}: size {inode.size} is not whole blocks")
        self.dir_bytes += inode.size
        if self.dir_bytes > MAX_ALL_DIR_BYTES:
            raise refuse(f"directories over {MAX_ALL_DIR_BYTES >> 20} MiB in all")
        data = self.contents(inode, MAX_DIR_BYTES)
        found: list[tuple[bytes, int]] = []
        names: set[bytes] = set()
        for base in range(0, len(data), self.bs):
            at = 0
            while at < self.bs:
                if at + 8 > self.bs:
                    raise refuse(f"directory {where}: a damaged block")
                number, rec_len, name_len = struct.unpack_from("<IHB", data, base + at)
                if self.bs == 65536 and rec_len in (0, 65535):
                    rec_len = 65536
                if rec_len < 8 + name_len or rec_len % 4 or at + rec_len > self.bs:
                    raise refuse(f"directory {where}: a damaged entry (record length {rec_len})")
                name = data[base + at + 8 : base + at + 8 + name_len]
                at += rec_len
                if number == 0 or name in (b".", b".."):
                    continue
                check_name(name, where)
                if name in names:
                    raise refuse(f"directory {where}: the name {name[:80]!r} twice")
                if len(found) >= most:
                    raise refuse(f"more than {MAX_ENTRIES} entries (directory {where})")
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
