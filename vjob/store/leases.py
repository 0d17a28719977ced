"""Named leases in the store: one holder at a time, taken and renewed by compare-and-set.

Why a row with an expiry and not a PostgreSQL advisory lock: the same code must hold on SQLite
(the default) and PostgreSQL, and a lease outlives a dropped connection for exactly its time to
live, not for however long a TCP timeout takes. A holder renews well before expiry; a standby
that tries meanwhile gets False and waits; when the holder dies, its lease runs out and the
standby's next try wins. The clock is each host's: keep the agents' hosts NTP-synchronised, and
the time to live well above the clock skew.
"""

from __future__ import annotations

import time

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

from vjob.store.db import Store
from vjob.store.schema import LeaseRecord


def acquire(store: Store, name: str, owner: str, ttl_s: float, *, at: float | None = None) -> bool:
    """Take or renew lease `name` for `owner` for `ttl_s` seconds; False if another holds it."""
    if ttl_s <= 0:
        raise ValueError(f"lease {name}: ttl_s = {ttl_s}: must be > 0")
    t = time.time() if at is None else at
    with store.session() as s:
        taken = s.execute(
            update(LeaseRecord)
            .where(LeaseRecord.name == name, (LeaseRecord.owner == owner) | (LeaseRecord.expires_at < t))
            .values(owner=owner, expires_at=t + ttl_s)
        )
        if taken.rowcount == 1:
            return True
        if s.scalar(select(LeaseRecord.name).where(LeaseRecord.name == name)) is not None:
            return False
    try:
        with store.session() as s:
            s.add(LeaseRecord(name=name, owner=owner, expires_at=t + ttl_s, acquired_at=t))
        return True
    except IntegrityError:
        return False  # another candidate inserted it first


def holder(store: Store, name: str, *, at: float | None = None) -> str | None:
    """Who holds `name` now (None: nobody, or the lease ran out)."""
    t = time.time() if at is None else at
    with store.session() as s:
        row = s.execute(select(LeaseRecord.owner, LeaseRecord.expires_at).where(LeaseRecord.name == name)).first()
    return row[0] if row is not None and row[1] >= t else None


def release(store: Store, name: str, owner: str) -> None:
    """Give `name` up (only if `owner` still holds it), so a standby need not wait for expiry."""
    with store.session() as s:
        s.execute(delete(LeaseRecord).where(LeaseRecord.name == name, LeaseRecord.owner == owner))


__all__ = ["acquire", "holder", "release"]
