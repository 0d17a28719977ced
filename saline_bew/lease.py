"""One site master acts on a best-effort vjob at a time: a compare-and-set lease per vjob.

Why: the documented set-up runs one master per site, all on one shared store, and each looks
at every active vjob. Without a lease both saw the same kill and both resubmitted it; one OAR
job was then orphaned until its walltime. A master may act on a vjob only while it holds the
vjob's lease: one bound `UPDATE … WHERE lease_owner IS NULL OR lease_owner = me OR
lease_expires_at < now`, whose row count says whether it won. The database makes the
compare-and-set atomic (SQLite and PostgreSQL alike); a master that dies stops renewing and
its leases expire, so another master takes its vjobs over.

Clocks: the expiry is each master's wall clock; the lease time must be much longer than the
skew between the masters' clocks (NTP keeps it well under a second).
"""

from __future__ import annotations

import os
import socket
import uuid

from sqlalchemy import or_, update

from vjob.store.db import Store
from vjob.store.schema import SalineJobRecord


def new_owner() -> str:
    """A name unique to this Manager object (tests, several managers in one process)."""
    return f"{socket.gethostname()[:32]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def host_owner() -> str:
    """The owner name of this host's site master, the same across restarts: a restarted
    manager takes its own leases back at once instead of waiting for them to expire. (One
    manager per host: `vjob besteffort manager` holds a lock file to make sure.)"""
    return f"master@{socket.gethostname()[:48]}"


def acquire(store: Store, key: str, owner: str, *, now: float, ttl_s: float) -> bool:
    """Take or renew the lease of `key` until now + ttl_s; False when another owner holds it."""
    with store.session() as s:
        result = s.execute(
            update(SalineJobRecord)
            .where(
                SalineJobRecord.key == key,
                or_(
                    SalineJobRecord.lease_owner.is_(None),
                    SalineJobRecord.lease_owner == owner,
                    SalineJobRecord.lease_expires_at < now,
                ),
            )
            .values(lease_owner=owner, lease_expires_at=now + ttl_s)
            .execution_options(synchronize_session=False)
        )
        return result.rowcount == 1


def release(store: Store, key: str, owner: str) -> None:
    """Give the lease back at once (a clean stop: a standby need not wait for the expiry)."""
    with store.session() as s:
        s.execute(
            update(SalineJobRecord)
            .where(SalineJobRecord.key == key, SalineJobRecord.lease_owner == owner)
            .values(lease_owner=None, lease_expires_at=None)
            .execution_options(synchronize_session=False)
        )


def release_all(store: Store, owner: str) -> None:
    with store.session() as s:
        s.execute(
            update(SalineJobRecord)
            .where(SalineJobRecord.lease_owner == owner)
            .values(lease_owner=None, lease_expires_at=None)
            .execution_options(synchronize_session=False)
        )


def holder(store: Store, key: str) -> tuple[str | None, float | None]:
    with store.session() as s:
        rec = s.get(SalineJobRecord, key)
        return (rec.lease_owner, rec.lease_expires_at) if rec is not None else (None, None)
