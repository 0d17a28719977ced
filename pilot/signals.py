"""The signals a pilot obeys, turned into flags its loop reads.

Why flags: a handler runs between any two bytecodes of the main thread, in the middle of a save
or a state file write; it only sets an event, and the pilot's loop (pilot.pilot) decides what
to do at a point where the VM and the state file are consistent.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any


class Signals:
    """SIGTERM/SIGINT/SIGUSR1 turned into flags the main loop reads (handlers do nothing else)."""

    def __init__(self) -> None:
        self.terminate = threading.Event()
        self.checkpoint = threading.Event()
        self.wake = threading.Event()
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        for sig, event in ((signal.SIGTERM, self.terminate), (signal.SIGINT, self.terminate)):
            self._old[sig] = signal.signal(sig, self._setter(event))
        self._old[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._setter(self.checkpoint))

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _setter(self, event: threading.Event) -> Callable[[int, FrameType | None], None]:
        def handler(_sig: int, _frame: FrameType | None) -> None:
            event.set()
            self.wake.set()

        return handler
