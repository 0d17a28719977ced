"""The state hashed while it is written (provisioning.save_hash): the digest is the file's.

A writer thread plays libvirt: the header with the partial magic, the stream in pieces, the
header rewritten at the end. Whatever the writer does last, `finish` must give the sha256 of
the file as it is on disk (by following when it provably can, by a second pass otherwise).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from provisioning.save_hash import CHUNK, FINAL_MAGIC, LAG, PARTIAL_MAGIC, FollowingHash

PIECE = 1 << 20


def _write_slowly(path: Path, body: bytes, *, started: threading.Event, header: bytes = PARTIAL_MAGIC) -> None:
    with open(path, "wb") as fh:
        fh.write(header)
        for i in range(0, len(body), PIECE):
            fh.write(body[i : i + PIECE])
            fh.flush()
            if i == 4 * PIECE:
                started.set()
            time.sleep(0.002)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _libvirt_like_save(path: Path, body: bytes, final_header: bytes) -> FollowingHash:
    follower = FollowingHash(path)
    started = threading.Event()
    writer = threading.Thread(target=_write_slowly, args=(path, body), kwargs={"started": started})
    writer.start()
    writer.join()
    deadline = time.monotonic() + 30
    while follower.hashed_bytes < len(body) - LAG - CHUNK and time.monotonic() < deadline:
        time.sleep(0.01)  # what libvirt's save call waits for: QEMU's last bytes
    with open(path, "r+b") as fh:  # libvirt marks the state complete
        fh.write(final_header)
    return follower


def test_a_state_hashed_while_written_has_the_digest_of_the_file_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "vm.state.part"
    body = os.urandom(40 * PIECE)
    follower = _libvirt_like_save(path, body, FINAL_MAGIC)
    assert follower.hashed_bytes > 16 * PIECE  # most of it was hashed before the writer was done
    final = tmp_path / "vm.state"
    path.rename(final)  # the driver renames it before it asks
    size, digest = follower.finish(final)
    assert follower.followed
    assert (size, digest) == (final.stat().st_size, _digest(final))
    assert final.read_bytes()[:16] == FINAL_MAGIC


def test_a_header_rewritten_otherwise_falls_back_to_a_full_pass(tmp_path: Path) -> None:
    path = tmp_path / "vm.state.part"
    follower = _libvirt_like_save(path, os.urandom(30 * PIECE), b"SomethingElse!!!")
    size, digest = follower.finish()
    assert not follower.followed
    assert (size, digest) == (path.stat().st_size, _digest(path))


def test_padding_truncated_before_the_writer_is_done_is_never_hashed(tmp_path: Path) -> None:
    path = tmp_path / "vm.state.part"
    body = os.urandom(30 * PIECE)
    follower = _libvirt_like_save(path, body + bytes(4096), FINAL_MAGIC)
    os.truncate(path, len(FINAL_MAGIC) + len(body))  # an O_DIRECT writer's padding of its last block, removed
    size, digest = follower.finish()
    assert follower.followed  # the reader stays LAG bytes behind a file still being written
    assert (size, digest) == (len(FINAL_MAGIC) + len(body), _digest(path))


def test_another_file_at_the_path_is_hashed_itself(tmp_path: Path) -> None:
    path = tmp_path / "vm.state.part"
    follower = _libvirt_like_save(path, os.urandom(20 * PIECE), FINAL_MAGIC)
    other = tmp_path / "other"
    other.write_bytes(path.read_bytes()[:-1] + b"\x00")
    other.rename(path)
    size, digest = follower.finish()
    assert not follower.followed
    assert (size, digest) == (path.stat().st_size, _digest(path))


def test_a_small_state_is_read_once_the_writer_is_done(tmp_path: Path) -> None:
    path = tmp_path / "vm.state.part"
    follower = FollowingHash(path)
    path.write_bytes(FINAL_MAGIC + b"x" * 1000)  # smaller than LAG: nothing is read before the end
    size, digest = follower.finish()
    assert follower.followed
    assert (size, digest) == (1016, _digest(path))


@pytest.mark.timeout(60)  # a reader still waiting for the file would hang `abandon` here
def test_a_failed_save_abandons_the_reader_without_waiting(tmp_path: Path) -> None:
    follower = FollowingHash(tmp_path / "never-written")
    follower.abandon()
    assert not follower._thread.is_alive()
    assert follower._fd is None
    (tmp_path / "never-written").write_bytes(FINAL_MAGIC)  # written after: nobody follows it any more
    assert follower.hashed_bytes == 0


def test_a_state_gone_by_the_end_gives_nothing_rather_than_a_digest(tmp_path: Path) -> None:
    path = tmp_path / "vm.state.part"
    follower = FollowingHash(path)
    path.write_bytes(FINAL_MAGIC + b"x" * 1000)
    path.unlink()
    assert follower.finish() is None
    assert not follower.followed
