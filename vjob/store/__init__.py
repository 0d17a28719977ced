"""The SQL state store: tables (schema), opening and migrating (db), and the few operations
that must be atomic under concurrency (jobs: Pn/Pt counters; identities: Saline's subnetIDs
and vmIDs)."""

from vjob.store.db import Store, head_revision, open_store

__all__ = ["Store", "head_revision", "open_store"]
