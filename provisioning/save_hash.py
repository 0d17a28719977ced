"""The sha256 of a memory state computed while libvirt writes it, instead of a second pass after.

Why: a save used to be libvirt writing the state, then the driver reading all of it again to
hash it (0.3–0.8 s for a few hundred MB on this machine, CPU work on two shared cores, the VM
paused meanwhile). A reader following the growing file hashes the bytes as they land, from the
page cache, while QEMU is still producing the rest; once libvirt returns only the last few MiB
are left.

What keeps the digest that of the bytes on disk:
- QEMU writes its migration stream sequentially into the file and never goes back, except
  for libvirt's header: it is written first with the magic `LibvirtQemudPart` and rewritten
  with `LibvirtQemudSave` once the state is complete. The follower hashes the final magic in
  place of the partial one and, when the save is over, reads the first block of the file again
  and compares it with what it hashed: any difference, or a size that is not the one it read
  up to, and the file is hashed again in full (the old, slower way). So a digest is never of
  a guess.
- It stays `LAG` bytes behind the end of the file until the writer is done: a writer with
  O_DIRECT pads its last block and truncates it afterwards.
- It reads through the file descriptor it opened, and `finish` checks that the path now
  names that same file (the driver renames it).
The digest recorded is still checked in full before any restore (`integrity.check_against`);
this only changes when the save's hash is computed, never what a restore trusts.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from provisioning import transfer

PARTIAL_MAGIC = b"LibvirtQemudPart"
"""libvirt's header magic while the state is being written (qemu_saveimage.c, QEMU_SAVE_PARTIAL)."""
FINAL_MAGIC = b"LibvirtQemudSave"
"""The magic libvirt writes over it once the state is complete (QEMU_SAVE_MAGIC)."""
CHUNK = 4 << 20
LAG = 8 << 20
"""Bytes left unread behind a file that is still being written (an O_DIRECT writer's padding)."""
POLL_S = 0.02


class FollowingHash:
    """Hash `path` while another process writes it; `finish` once the writer is done.

    The reader is a thread: hashlib and pread release the GIL, so it runs beside the libvirt
    call that waits for the save. `abandon` stops it (a failed save).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer_done = threading.Event()
        self._stop = threading.Event()
        self._digest = hashlib.sha256()
        self._head = b""
        self._fed = 0
        self._fd: int | None = None
        self._error: BaseException | None = None
        self.followed = False
        """After `finish`: whether the digest came from following (False: a full second pass)."""
        self._thread = threading.Thread(target=self._run, name=f"vjob-hash-{path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while self._fd is None:
                # Read before the open: a writer done by then left its file there. Read after a
                # failed open, a writer that finished meanwhile would leave its file unfollowed.
                done = self._writer_done.is_set() or self._stop.is_set()
                try:
                    self._fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                except FileNotFoundError:
                    if done:
                        return
                    self._writer_done.wait(POLL_S)
            while not self._stop.is_set():
                done = self._writer_done.is_set()  # before the size: what it sees then is all there is
                size = os.fstat(self._fd).st_size
                self._read_to(size if done else size - LAG, final=done)
                if done:
                    return
                self._writer_done.wait(POLL_S)
        except BaseException as exc:  # noqa: BLE001 - finish() falls back to a full pass
            self._error = exc

    @property
    def hashed_bytes(self) -> int:
        """How far the reader has hashed so far."""
        return self._fed

    def _read_to(self, limit: int, *, final: bool) -> None:
        assert self._fd is not None
        while not self._stop.is_set() and (self._fed + CHUNK <= limit or (final and self._fed < limit)):
            block = os.pread(self._fd, min(CHUNK, limit - self._fed), self._fed)
            if not block:
                return
            if self._fed == 0:
                self._head = block
                if block.startswith(PARTIAL_MAGIC):
                    block = FINAL_MAGIC + block[len(PARTIAL_MAGIC) :]
                    self._head = block
            self._digest.update(block)
            self._fed += len(block)

    def finish(self, path: Path | None = None) -> tuple[int, str] | None:
        """(size, sha256) of the file now at `path` (default: where it was written), once the
        writer is done: the followed digest if it provably covers that file, else a full pass;
        None when there is no file there."""
        self._writer_done.set()
        self._thread.join()
        final = path or self.path
        try:
            if self._error is None and self._fd is not None and self._covers(final):
                self.followed = True
                return self._fed, self._digest.hexdigest()
        finally:
            self._close()
        try:
            return final.stat().st_size, transfer.sha256_file(final)
        except FileNotFoundError:
            return None

    def _covers(self, final: Path) -> bool:
        assert self._fd is not None
        mine = os.fstat(self._fd)
        try:
            there = os.stat(final, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if (mine.st_dev, mine.st_ino) != (there.st_dev, there.st_ino) or there.st_size != self._fed:
            return False
        return os.pread(self._fd, len(self._head), 0) == self._head

    def abandon(self) -> None:
        """Stop following (the save failed): nothing is returned, the file descriptor is closed."""
        self._stop.set()
        self._writer_done.set()
        self._thread.join()
        self._close()

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
