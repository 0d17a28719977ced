"""`vjob db backup` / `vjob db restore`: a consistent copy of vjob's store, and putting it back.

Two formats, both read by the same restore:

- a SQLite store is copied with SQLite's online backup API (`sqlite3.Connection.backup`): one
  step over a read transaction, so a copy taken while the agent writes is a snapshot of one
  instant, and the result is a plain SQLite database an operator can open with `sqlite3`;
- a PostgreSQL store is written as a vjob dump: one JSON object per line (a header with the
  schema revision, then each table's columns and rows), read inside one REPEATABLE READ, READ
  ONLY transaction, so every table comes from the same snapshot. Why not pg_dump: pg_dump
  refuses a server newer than itself (the Debian client of the controller and the site's
  database server are upgraded apart), it needs its own credentials plumbing (PGPASSWORD, a
  .pgpass), and it would take Optuna's study tables along unless each of vjob's tables is named.
  The dump holds vjob's tables and its revision only, and it restores on SQLite too (moving a
  site from the embedded store to PostgreSQL is the same two commands).

Restore loads every row in one transaction of the target store (all or nothing), after checking
that the backup's schema revision is the code's head (or, when told, migrating the empty target
to the backup's revision first), and refuses a store that already holds rows unless forced.
PostgreSQL's id sequences are moved past the restored ids, or the next insert would collide.

A backup holds job and user names: it is written 0600 beside its final name and renamed into
place whole, so a reader never sees half a backup and nobody else can read it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic.script import ScriptDirectory
from sqlalchemy import Engine, MetaData, Table, create_engine, func, insert, select, text
from sqlalchemy.exc import DBAPIError

from vjob.errors import InputError, SchemaOutdatedError, StoreError, UsageError
from vjob.store.db import VERSION_TABLE, Store, _alembic_config, head_revision, known_revision, sqlite_file
from vjob.store.schema import Base

FORMAT = "vjob-store-dump"
FORMAT_VERSION = 1
SQLITE_MAGIC = b"SQLite format 3\x00"
MAX_LINE = 64 * 1024 * 1024
"""A dump line longer than this is refused (a row of vjob's is a few hundred bytes)."""

VJOB_TABLES: tuple[str, ...] = tuple(t.name for t in Base.metadata.sorted_tables)
"""vjob's tables in foreign-key order (parents first): the only ones backed up or restored. A
database shared with Optuna's study tables keeps those out of vjob's backups."""


@dataclass(frozen=True)
class BackupResult:
    path: Path
    revision: str
    rows: dict[str, int]
    format: str


def backup(store: Store, path: Path) -> BackupResult:
    """Write a consistent backup of `store` to `path` (mode 0600, replaced whole)."""
    revision = store.current_revision()
    if revision is None:
        raise SchemaOutdatedError(f"database {store.safe_url} has no vjob schema: there is nothing to back up")
    tmp = path.with_name(f".{path.name}.part-{os.getpid()}")
    fd = _create_private(tmp)
    try:
        source = sqlite_file(store.url)
        if source is not None:
            os.close(fd)
            rows = _backup_sqlite(source, tmp)
            fmt = "sqlite"
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                rows = _dump(store, revision, out)
            fmt = FORMAT
        if fmt == "sqlite":
            _check_copy(tmp)
        _sync_into_place(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fmt == "sqlite":
        revision = _sqlite_revision(path) or revision
    return BackupResult(path, revision, rows, fmt)


def _sync_into_place(tmp: Path, path: Path) -> None:
    """fsync the finished copy, then rename it over `path`: after a crash the name holds the old
    backup or the whole new one."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError as exc:
        raise StoreError(f"backup {path}: cannot put it there: {exc.strerror}") from None


def _create_private(path: Path) -> int:
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise StoreError(f"backup {path.parent}: cannot write there: {exc.strerror}") from None


def _backup_sqlite(source: Path, target: Path) -> dict[str, int]:
    """Copy `source` into `target` (an empty 0600 file) with the online backup API; the copy is
    left in rollback-journal mode, one self-contained file."""
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)
    try:
        dst = sqlite3.connect(str(target))
        try:
            src.backup(dst)  # pages=-1: one step, one read transaction of the source
            dst.execute("PRAGMA journal_mode=DELETE")
            return {
                name: int(dst.execute(f'SELECT COUNT(*) FROM "{name}"').fetchone()[0])
                for name in VJOB_TABLES
                if dst.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone()
            }
        finally:
            dst.close()
    except sqlite3.Error as exc:
        raise StoreError(f"backup of {source}: {exc}") from None
    finally:
        src.close()


def _dump(store: Store, revision: str, out: Any) -> dict[str, int]:
    """vjob's tables as JSON lines, all read from one REPEATABLE READ snapshot."""
    meta = MetaData()
    counts: dict[str, int] = {}
    snapshot = {"isolation_level": "REPEATABLE READ"} if store.dialect == "postgresql" else {}
    with store.engine.connect().execution_options(**snapshot) as conn:  # SQLite: BEGIN IMMEDIATE
        if store.dialect == "postgresql":
            conn.execute(text("SET TRANSACTION READ ONLY"))
        meta.reflect(bind=conn, only=[t for t in VJOB_TABLES if store.engine.dialect.has_table(conn, t)])
        header = {"format": FORMAT, "version": FORMAT_VERSION, "revision": revision, "dialect": store.dialect}
        out.write(json.dumps(header) + "\n")
        for name in VJOB_TABLES:
            if name not in meta.tables:
                continue
            table = meta.tables[name]
            columns = [c.name for c in table.columns]
            out.write(json.dumps({"table": name, "columns": columns}) + "\n")
            counts[name] = 0
            pk = list(table.primary_key.columns) or list(table.columns)
            for row in conn.execute(select(table).order_by(*pk)):
                out.write(json.dumps(list(row)) + "\n")
                counts[name] += 1
        conn.rollback()
    return counts


def _check_copy(path: Path) -> None:
    """Open a just-written SQLite backup read-only once: a copy SQLite cannot read is an error
    now, not at the restore that needed it."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            raise StoreError(f"backup {path}: the copy fails SQLite's quick_check")
    finally:
        conn.close()


def _sqlite_revision(path: Path) -> str | None:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = conn.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchone()
        return str(row[0]) if row else None
    except sqlite3.Error:
        return None
    finally:
        conn.close()


# -- reading a backup ------------------------------------------------------------------------


@dataclass
class _Source:
    """A backup opened for reading: its revision and, per table, its columns and rows."""

    revision: str
    tables: dict[str, tuple[list[str], Iterator[list[Any]] | None]]
    engine: Engine | None = None

    def close(self) -> None:
        if self.engine is not None:
            self.engine.dispose()


def _open_backup(path: Path) -> _Source:
    try:
        with path.open("rb") as fh:
            magic = fh.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise InputError(f"backup {path}: cannot read it: {exc.strerror}") from None
    if magic == SQLITE_MAGIC:
        return _open_sqlite_backup(path)
    return _open_dump(path)


def _open_sqlite_backup(path: Path) -> _Source:
    engine = create_engine(f"sqlite:///file:{path}?mode=ro&uri=true", future=True)
    revision = _sqlite_revision(path)
    if revision is None:
        engine.dispose()
        raise InputError(f"backup {path}: a SQLite database without vjob's schema ({VERSION_TABLE} is missing)")
    meta = MetaData()
    with engine.connect() as conn:
        meta.reflect(bind=conn, only=[t for t in VJOB_TABLES if engine.dialect.has_table(conn, t)])
    tables: dict[str, tuple[list[str], Iterator[list[Any]] | None]] = {}
    for name, table in meta.tables.items():
        tables[name] = ([c.name for c in table.columns], _sqlite_rows(engine, table))
    return _Source(revision, tables, engine)


def _sqlite_rows(engine: Engine, table: Table) -> Iterator[list[Any]]:
    with engine.connect() as conn:
        for row in conn.execute(select(table)):
            yield list(row)


def _open_dump(path: Path) -> _Source:
    """Read a vjob dump whole (validated before the store is touched: a truncated or foreign
    file is refused without a write)."""
    tables: dict[str, tuple[list[str], Iterator[list[Any]] | None]] = {}
    rows: dict[str, list[list[Any]]] = {}
    current: str | None = None
    width = 0
    with path.open("r", encoding="utf-8", errors="strict") as fh:
        try:
            header = json.loads(fh.readline(MAX_LINE) or "null")
        except (json.JSONDecodeError, UnicodeDecodeError):
            header = None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise InputError(f"backup {path}: neither a SQLite database nor a vjob dump")
        if header.get("version") != FORMAT_VERSION or not isinstance(header.get("revision"), str):
            raise InputError(f"backup {path}: dump format {header.get('version')!r} is not one this vjob reads")
        for number, line in enumerate(iter(lambda: fh.readline(MAX_LINE), ""), start=2):
            if not line.endswith("\n"):
                raise InputError(f"backup {path}: line {number} is cut or longer than {MAX_LINE} bytes")
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                raise InputError(f"backup {path}: line {number} is not JSON") from None
            if isinstance(item, dict):
                name, columns = item.get("table"), item.get("columns")
                if name not in VJOB_TABLES or not isinstance(columns, list) or name in rows:
                    raise InputError(f"backup {path}: line {number}: not one of vjob's tables: {str(name)[:80]!r}")
                current, width = name, len(columns)
                rows[name] = []
                tables[name] = ([str(c) for c in columns], None)
            elif isinstance(item, list) and current is not None and len(item) == width:
                if not all(v is None or isinstance(v, (int, float, str)) for v in item):
                    raise InputError(f"backup {path}: line {number}: a value of another type than number or text")
                rows[current].append(item)
            else:
                raise InputError(f"backup {path}: line {number}: not a row of {current or 'any table'}")
    return _Source(header["revision"], {n: (cols, iter(rows[n])) for n, (cols, _) in tables.items()})


# -- restoring --------------------------------------------------------------------------------


def _row_count(store: Store) -> int:
    meta = MetaData()
    with store.engine.connect() as conn:
        meta.reflect(bind=conn, only=[t for t in VJOB_TABLES if store.engine.dialect.has_table(conn, t)])
        return sum(int(conn.execute(select(func.count()).select_from(t)).scalar_one()) for t in meta.tables.values())


def restore(store: Store, path: Path, *, force: bool = False, any_revision: bool = False) -> BackupResult:
    """Load the backup at `path` into `store` in one transaction (see the module's docstring)."""
    source = _open_backup(path)
    try:
        head = head_revision()
        if source.revision != head:
            if not any_revision:
                raise UsageError(
                    f"backup {path} is at schema {source.revision}, this vjob's is {head}: restore it with "
                    f"the vjob that made it, or pass --any-revision (then run 'vjob db upgrade')"
                )
            known_revision(source.revision)
        current = store.current_revision()
        if current is not None and _row_count(store) and not force:
            raise UsageError(
                f"database {store.safe_url} already holds vjob's rows: restoring would replace them all; "
                f"pass --force to do so (back them up first: vjob db backup FILE)"
            )
        _refuse_live_lease(store)
        if current != source.revision:
            if current is not None and _row_count(store):
                raise UsageError(
                    f"database {store.safe_url} is at schema {current}, the backup at {source.revision}: "
                    f"empty it first ('vjob db downgrade base') to restore a backup of another schema"
                )
            if current is not None and _is_older(source.revision, current):
                store.downgrade(source.revision)
            else:
                store.upgrade(source.revision)
        counts = _load(store, source)
        return BackupResult(path, source.revision, counts, "sqlite" if source.engine is not None else FORMAT)
    finally:
        source.close()


def _refuse_live_lease(store: Store) -> None:
    """A running agent (or Saline manager) holds a lease: it would write over the restored state
    with what it observes next, and its journal would no longer match the store."""
    with store.engine.connect() as conn:
        if not store.engine.dialect.has_table(conn, "leases"):
            return
        live = conn.execute(
            text("SELECT name, owner FROM leases WHERE expires_at >= :t ORDER BY name"), {"t": time.time()}
        ).first()
    if live is not None:
        raise UsageError(
            f"database {store.safe_url}: {live[0]} is held by {live[1]} (a running agent): stop it "
            "first (systemctl stop vjob-agent), then restore"
        )


def _is_older(revision: str, than: str) -> bool:
    order = [r.revision for r in ScriptDirectory.from_config(_alembic_config("sqlite://")).walk_revisions()]
    return order.index(revision) > order.index(than)  # walk_revisions goes newest first


def _load(store: Store, source: _Source) -> dict[str, int]:
    meta = MetaData()
    counts: dict[str, int] = {}
    try:
        with store.engine.begin() as conn:
            meta.reflect(bind=conn, only=[t for t in VJOB_TABLES if store.engine.dialect.has_table(conn, t)])
            present = [n for n in VJOB_TABLES if n in meta.tables]
            for name in reversed(present):
                conn.execute(meta.tables[name].delete())
            for name in present:
                if name not in source.tables:
                    continue
                table = meta.tables[name]
                columns, rows = source.tables[name]
                unknown = [c for c in columns if c not in table.columns]
                if unknown:
                    raise InputError(f"backup: table {name} has columns the store lacks: {', '.join(unknown)[:200]}")
                counts[name] = 0
                batch: list[dict[str, Any]] = []
                for row in rows or ():
                    batch.append(dict(zip(columns, row, strict=True)))
                    if len(batch) >= 1000:
                        conn.execute(insert(table), batch)
                        counts[name] += len(batch)
                        batch = []
                if batch:
                    conn.execute(insert(table), batch)
                    counts[name] += len(batch)
            if store.dialect == "postgresql":
                _advance_sequences(conn, [meta.tables[n] for n in present])
    except (DBAPIError, sqlite3.Error) as exc:
        raise StoreError(f"database {store.safe_url}: restore: {store._reason(exc)} (nothing was written)") from None
    return counts


def _advance_sequences(conn: Any, tables: list[Table]) -> None:
    """Move each serial column's sequence past the restored ids (PostgreSQL only)."""
    for table in tables:
        for column in table.primary_key.columns:
            seq = conn.execute(text("SELECT pg_get_serial_sequence(:t, :c)"), {"t": table.name, "c": column.name})
            name = seq.scalar_one()
            if name is None:
                continue
            top = conn.execute(select(func.max(column))).scalar_one()
            if top is None:
                conn.execute(text("SELECT setval(CAST(:s AS regclass), 1, false)"), {"s": name})
            else:
                conn.execute(text("SELECT setval(CAST(:s AS regclass), :v, true)"), {"s": name, "v": int(top)})
