"""The guest's output copied to the job's: what the VM prints reaches the RMS's output file.

Why a copy rather than the VM writing there: the VM's console and output logs are libvirt's
files on the node where the VM runs (they start empty on another node after a move), while the
job's output belongs to the RMS; the pilot tails the first into the second, and after a
requeue (the RMS truncated the output) copies it all again (pilot.pilot).
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import IO


class ConsoleTail(threading.Thread):
    """Copies what the guest prints (its console log) to the job's output as it grows."""

    def __init__(self, path: Path, out: IO[str], start_at_end: bool, *, offset: int | None = None) -> None:
        super().__init__(name="console-tail", daemon=True)
        self.path = path
        self.out = out
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        if offset is not None:
            self.offset = offset  # where the copy stood at the last save: nothing skipped, nothing twice
        else:
            self.offset = path.stat().st_size if start_at_end and path.exists() else 0

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.drain()
            self.stop_event.wait(0.25)
        self.drain()

    def drain(self) -> None:
        with self.lock:  # the loop and a save both drain
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(self.offset)
                    data = fh.read()
            except (FileNotFoundError, PermissionError):
                return
            if data:
                self.offset += len(data)
                self.out.write(data.decode("utf-8", errors="replace"))
                self.out.flush()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=2)


def empty_file(stream: IO[str]) -> bool:
    """Whether `stream` is an empty regular file (a fresh or truncated job output file)."""
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == 0


def last_lines(path: Path, count: int) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 8192))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip()][-count:]
