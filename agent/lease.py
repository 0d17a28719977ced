"""The cluster's agent lease: one agent per RMS acts at a time (a row in the store).

Why its own record: every step that starts a switch asks the same two questions — may I act now
(`held`: the lease covers it, or is taken now) and may I go on (`valid`: it still covers the next
action) — and a switch that waits on saves must keep the lease while it waits (`keeping`). The
steps get the lease through the agent's ports (agent.ports), never the agent itself.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from agent.metrics import AgentMetrics
from vjob.config import Config
from vjob.errors import StoreError
from vjob.sdnotify import Notifier
from vjob.store import leases
from vjob.store.db import Store


class Lease:
    """This agent's hold on `agent:<rms>`: taken and renewed each tick, kept by a thread while
    a switch waits, lost when another agent holds it or the store does not answer in time."""

    def __init__(
        self,
        cfg: Config,
        rms: str,
        owner: str,
        store: Callable[[], Store],
        *,
        metrics: AgentMetrics,
        log: Any,
        notify: Notifier,
        on_gain: Callable[[], None] = lambda: None,
    ) -> None:
        """`store`: the agent's store, opened on demand (agent.ports.StoreLink). `on_gain`: called
        when this agent becomes the holder (the previous one may have left a switch open)."""
        self.cfg = cfg
        self.name = f"agent:{rms}"
        self.owner = owner
        self.store = store
        self.metrics = metrics
        self.log = log
        self.notify = notify
        self.on_gain = on_gain
        self.until = 0.0
        """When the lease runs out by this agent's clock (0: not held)."""

    def hold(self) -> bool:
        """Take or renew this cluster's lease; False when another agent holds it."""
        ttl = self.cfg.agent.lease_s
        held = leases.acquire(self.store(), self.name, self.owner, ttl)
        was = self.until > time.time()
        self.until = time.time() + ttl if held else 0.0
        self.metrics.active.set(1 if held else 0)
        if held and not was:
            self.log.info("active: holding the agent lease", lease=self.name, owner=self.owner)
            self.on_gain()
        elif not held and was:
            self.log.error("lost the agent lease to another agent: standing by", lease=self.name)
        return held

    def valid(self) -> bool:
        """Whether the lease still covers the next action (with a margin for clock and I/O)."""
        return time.time() < self.until - min(5.0, self.cfg.agent.lease_s / 3)

    def held(self) -> bool:
        """Whether the agent may start acting: its lease still covers it, or it takes it now (a
        step run outside the tick's acting phase). False when another agent holds it: a switch
        is then not started, its executor would abandon it at once."""
        return self.valid() or self.hold()

    @contextlib.contextmanager
    def keeping(self, *, active: bool = True) -> Iterator[None]:
        """Renew the lease from a thread for as long as the block acts.

        Why: a switch waits for its victims' saves (minutes for a big VM, agent.act), far
        longer than the lease; unrenewed, it ran out mid-switch and a standby took over, rolled
        the switch back and withdrew the live checkpoint request. The keeper renews every third
        of `lease_s` and feeds systemd's watchdog meanwhile (for at most
        `checkpoint_timeout_max_s`: a tick hung longer is the watchdog's). When the lease is
        lost (another agent holds it, or the store did not answer until it expired) `valid()`
        turns False and the acting code stops: the executor starts and journals nothing more,
        a waiting checkpoint is left to the new holder, who finishes or undoes the switch
        (agent.recover)."""
        if not active or self.until <= 0:
            yield
            return
        stop = threading.Event()
        keeper = threading.Thread(target=self._keep, args=(self.store(), stop), name="vjob-lease-keeper", daemon=True)
        keeper.start()
        try:
            yield
        finally:
            stop.set()
            keeper.join(timeout=self.cfg.agent.command_timeout_s + 5)

    def _keep(self, store: Store, stop: threading.Event) -> None:
        ttl = self.cfg.agent.lease_s
        period = ttl / 3
        wait = period
        feed_until = time.monotonic() + self.cfg.agent.checkpoint_timeout_max_s  # then a hung tick shows
        while not stop.wait(wait):
            if self.until <= 0:
                return  # lost already (the main thread saw it)
            t = time.time()
            try:
                held = leases.acquire(store, self.name, self.owner, ttl, at=t)
            except (StoreError, ValueError) as exc:
                if not self.valid():
                    self._lose(f"the store did not answer before it ran out: {exc}")
                    return
                self.log.warning("cannot renew the agent lease, retrying", lease=self.name, error=str(exc))
                wait = min(1.0, period)
                continue
            if not held:
                self._lose("another agent holds it")
                return
            self.until = t + ttl
            if time.monotonic() < feed_until:
                self.notify.watchdog()  # the tick waits on saves, each bounded by its timeout
            wait = period

    def _lose(self, why: str) -> None:
        """The lease is gone while acting: everything acting checks valid() and stops."""
        self.until = 0.0
        self.metrics.active.set(0)
        self.metrics.errors.labels(kind="lease").inc()
        self.log.error(
            "lost the agent lease while acting: stopping, the switch is left to its new holder",
            lease=self.name,
            why=why,
        )

    def give_up(self) -> None:
        """Release the lease on the way out, so a standby takes over at once."""
        try:
            leases.release(self.store(), self.name, self.owner)
        except StoreError:
            pass  # it runs out by itself
        self.until = 0.0


__all__ = ["Lease"]
