"""Progress of a long run: a live rich bar on a terminal, plain lines every few percent otherwise.

Why: a sweep or a long simulation run as a batch job writes to a file; rich's live bar prints
nothing there until the end, so the log said nothing for hours. Off a terminal this prints one
plain, greppable line each `step_pct` percent (and at the end):

    simulate: 35% (350/1000) elapsed 12 s, about 22 s left

Usage::

    with Progress(len(runs), "sweep") as progress:
        for run in runs:
            ...
            progress.advance()
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import IO, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

T = TypeVar("T")


class Progress:
    """Counts `total` steps of `label`; live on a terminal, plain lines otherwise."""

    def __init__(
        self,
        total: int,
        label: str,
        *,
        stream: IO[str] | None = None,
        step_pct: float = 5.0,
        live: bool | None = None,
    ) -> None:
        self.total = max(0, int(total))
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.step_pct = max(0.1, float(step_pct))
        self.live = self.stream.isatty() if live is None else live
        self.done = 0
        self._started = time.monotonic()
        self._next_pct = self.step_pct
        self._rich: RichProgress | None = None
        self._task: int | None = None

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        if self.live:
            self._rich = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._rich.start()
            self._task = self._rich.add_task(self.label, total=self.total or None)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._rich is not None:
            self._rich.stop()
        elif kind is None and self.done < self.total:
            self._line()  # ended early (e.g. a run stopped at its horizon): say where

    def advance(self, steps: int = 1) -> None:
        """Count `steps` more done; print a line when a new `step_pct` mark is passed."""
        self.done = min(self.total, self.done + steps) if self.total else self.done + steps
        if self._rich is not None and self._task is not None:
            self._rich.update(self._task, completed=self.done)
            return
        if not self.total:
            return
        pct = 100.0 * self.done / self.total
        if pct >= self._next_pct or self.done == self.total:
            self._line()
            while self._next_pct <= pct:
                self._next_pct += self.step_pct

    def relabel(self, label: str) -> None:
        """Say something new beside the count (e.g. the best result so far)."""
        self.label = label
        if self._rich is not None and self._task is not None:
            self._rich.update(self._task, description=label)

    def _line(self) -> None:
        elapsed = time.monotonic() - self._started
        pct = 100.0 * self.done / self.total if self.total else 100.0
        left = ""
        if 0 < self.done < self.total:
            left = f", about {elapsed * (self.total - self.done) / self.done:.0f} s left"
        self.stream.write(f"{self.label}: {pct:.0f}% ({self.done}/{self.total}) elapsed {elapsed:.0f} s{left}\n")
        self.stream.flush()


def track(items: Iterable[T], total: int, label: str, **options: object) -> Iterator[T]:
    """Yield `items`, counting each one done (see Progress for `options`)."""
    with Progress(total, label, **options) as progress:  # type: ignore[arg-type]
        for item in items:
            yield item
            progress.advance()


__all__ = ["Progress", "track"]
