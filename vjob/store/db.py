"""Opening the state store, checking its schema, and running Alembic migrations.

Why a schema check on every open: an agent writing to a database at an older schema corrupts
it quietly, and one at a newer schema (after a rollback of the code) breaks it. Both must be
a clear error telling the operator what to run, before anything is written.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    NoSuchModuleError,
    PendingRollbackError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker

import migrations
from vjob.errors import ConfigError, SchemaOutdatedError, SchemaTooNewError, StoreError, UsageError
from vjob.secrets import mask_text, mask_url

# What a lost or broken database looks like from SQLAlchemy: any DBAPI error (OperationalError,
# InterfaceError, DatabaseError from a cut connection or a corrupt SQLite file...), a pool that
# cannot hand out a connection, a session whose connection died under it. IntegrityError is a
# DBAPIError too, but it is an answer, not an outage: callers catch it to retry (see below).
CONNECTION_ERRORS: tuple[type[Exception], ...] = (
    DBAPIError,
    DisconnectionError,
    PoolTimeoutError,
    PendingRollbackError,
)


VERSION_TABLE = "vjob_alembic_version"
"""vjob's own Alembic version table. Alembic's default, `alembic_version`, is also Optuna's
(a `vjob tune` study kept in the same database): whichever came first broke the other."""
LEGACY_VERSION_TABLE = "alembic_version"
"""Where vjob before issue 18 kept its revision; `vjob db upgrade` moves it to VERSION_TABLE."""


def now() -> float:
    """The store's clock: POSIX seconds."""
    return time.time()


def _alembic_config(url: str) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    """The newest schema revision this code knows."""
    head = ScriptDirectory.from_config(_alembic_config("sqlite://")).get_current_head()
    assert head is not None, "migrations/versions holds no revision"
    return head


def _safe_url(url: str) -> str:
    """`url` as it may be printed, logged or stored (vjob.secrets.mask_url)."""
    return mask_url(url)


def make_engine(url: str, *, connect_timeout_s: float = 5.0, busy_timeout_s: float = 30.0) -> Engine:
    """An engine for `url`; SQLite gets WAL, a busy timeout and enforced foreign keys."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(f"database.url = {_safe_url(url)!r}: not a valid SQLAlchemy URL") from None
    kwargs: dict[str, Any] = {"future": True}
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            try:
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"database {_safe_url(url)}: cannot create its directory: {exc.strerror}") from None
        # isolation_level=None lets us issue BEGIN IMMEDIATE ourselves (see begin()).
        kwargs["connect_args"] = {"timeout": busy_timeout_s, "isolation_level": None}
    elif parsed.get_backend_name() == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        kwargs["connect_args"] = {"connect_timeout": max(1, int(connect_timeout_s))}
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(parsed, **kwargs)
    except (NoSuchModuleError, ImportError) as exc:
        raise ConfigError(f"database.url = {_safe_url(url)!r}: unsupported database driver ({exc})") from None
    if parsed.get_backend_name() == "sqlite":

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            # Take the write lock at the start: read-modify-write under concurrency is then
            # serialised instead of failing with "database is locked" at commit time.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


class Store:
    """The state store: an engine, a session factory and the schema guard."""

    def __init__(self, url: str, *, connect_timeout_s: float = 5.0, busy_timeout_s: float = 30.0) -> None:
        self.url = url
        self.engine = make_engine(url, connect_timeout_s=connect_timeout_s, busy_timeout_s=busy_timeout_s)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @classmethod
    def from_config(cls, config: Any) -> Store:
        return cls(
            config.database_url,
            connect_timeout_s=config.database.connect_timeout_s,
            busy_timeout_s=config.database.busy_timeout_s,
        )

    @property
    def safe_url(self) -> str:
        return _safe_url(self.url)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    # -- schema ---------------------------------------------------------------------------
    def current_revision(self) -> str | None:
        """The revision the database is at (None when empty); raises StoreError if unreachable."""
        try:
            with self.engine.connect() as conn:
                return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
        except CONNECTION_ERRORS as exc:
            raise StoreError(f"database {self.safe_url} is unreachable: {self._reason(exc)}") from None

    def legacy_revision(self) -> str | None:
        """vjob's revision still in the shared `alembic_version` table (an install from before
        VERSION_TABLE), or None; another tool's revision there (Optuna's) is not vjob's."""
        try:
            with self.engine.connect() as conn:
                return _legacy_revision(conn)
        except CONNECTION_ERRORS as exc:
            raise StoreError(f"database {self.safe_url} is unreachable: {self._reason(exc)}") from None

    def check(self) -> str:
        """Refuse a database that is not exactly at the code's head revision."""
        current = self.current_revision()
        head = head_revision()
        if current == head:
            return current
        script = ScriptDirectory.from_config(_alembic_config(self.url))
        if current is None:
            legacy = self.legacy_revision()
            if legacy is not None:
                raise SchemaOutdatedError(
                    f"database {self.safe_url} keeps vjob's schema {legacy} in the shared table "
                    f"{LEGACY_VERSION_TABLE}: run 'vjob db upgrade' (moves it to {VERSION_TABLE})"
                )
            raise SchemaOutdatedError(f"database {self.safe_url} has no vjob schema: run 'vjob db upgrade'")
        known = {rev.revision for rev in script.walk_revisions()}
        if current not in known:
            raise SchemaTooNewError(
                f"database {self.safe_url} is at schema {current}, newer than this vjob knows "
                f"(head {head}): upgrade vjob, or downgrade the database with the newer vjob"
            )
        raise SchemaOutdatedError(
            f"database {self.safe_url} is at schema {current}, older than {head}: run 'vjob db upgrade'"
        )

    def upgrade(self, revision: str = "head") -> None:
        self.current_revision()  # reachability, with the clear error
        try:
            self.adopt_legacy_version()
            command.upgrade(_alembic_config(self.url), revision)
        except CONNECTION_ERRORS as exc:  # cut mid-migration: Alembic ran it in one transaction
            raise StoreError(f"database {self.safe_url}: upgrade to {revision}: {self._reason(exc)}") from None

    def adopt_legacy_version(self) -> str | None:
        """Move vjob's revision from `alembic_version` to VERSION_TABLE, in one transaction, and
        drop `alembic_version` when nothing else is left in it (so Optuna can create its own);
        returns the moved revision (None: nothing to move)."""
        script = ScriptDirectory.from_config(_alembic_config(self.url))
        with self.engine.begin() as conn:
            revision = _legacy_revision(conn)
            if revision is None:
                return None
            ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            if ctx.get_current_revision() is not None:
                return None  # already moved; a stale row in alembic_version is not ours to touch
            ctx.stamp(script, revision)
            conn.execute(text(f"DELETE FROM {LEGACY_VERSION_TABLE} WHERE version_num = :rev"), {"rev": revision})
            left = conn.execute(text(f"SELECT COUNT(*) FROM {LEGACY_VERSION_TABLE}")).scalar_one()
            if left == 0:
                conn.execute(text(f"DROP TABLE {LEGACY_VERSION_TABLE}"))
        return revision

    def downgrade(self, revision: str = "base") -> None:
        self.current_revision()
        try:
            command.downgrade(_alembic_config(self.url), revision)
        except CONNECTION_ERRORS as exc:
            raise StoreError(f"database {self.safe_url}: downgrade to {revision}: {self._reason(exc)}") from None

    # -- sessions -------------------------------------------------------------------------
    def session(self, operation: str | None = None) -> AbstractContextManager[Session]:
        """A transaction: committed when the block ends, rolled back on any exception.

        A lost or broken database (CONNECTION_ERRORS) becomes a StoreError naming `operation`
        (by default the calling function) and the masked URL, so that every caller's "store
        unavailable" path sees one exception type and no caller logs a password.
        IntegrityError passes through unchanged: it is how a racing insert learns it lost.
        """
        name = operation or sys._getframe(1).f_code.co_qualname  # the caller of session()
        return self._session(name)

    @contextmanager
    def _session(self, operation: str) -> Iterator[Session]:
        try:
            with self._sessions.begin() as session:
                yield session
        except IntegrityError:
            raise
        except CONNECTION_ERRORS as exc:
            raise StoreError(f"database {self.safe_url}: {operation}: {self._reason(exc)}") from None

    def ping(self) -> None:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except CONNECTION_ERRORS as exc:
            raise StoreError(f"database {self.safe_url} is unreachable: {self._reason(exc)}") from None

    def _reason(self, exc: BaseException) -> str:
        """The driver's first line, with any secret of this store's URL masked out of it."""
        return mask_text(_first_line(exc), self.url)

    def close(self) -> None:
        self.engine.dispose()


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL; None for another database or SQLite in memory."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None  # make_engine names the bad URL
    name = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or name in ("", ":memory:") or name.startswith("file:"):
        return None
    return Path(name)


def known_revision(revision: str) -> str:
    """`revision` when Alembic can reach it (an id, a unique prefix, head, base, or a relative
    step such as -1), else a UsageError naming it and the ids there are: checked before the
    database is touched, so that a typo creates and changes nothing."""
    script = ScriptDirectory.from_config(_alembic_config("sqlite://"))
    known = [rev.revision for rev in script.walk_revisions()]
    relative = revision[:1] in ("+", "-") and revision[1:].isdigit()
    if revision in ("head", "heads", "base") or relative or (revision and any(k.startswith(revision) for k in known)):
        return revision
    raise UsageError(f"revision {revision[:80]!r}: unknown; known: head, base, {', '.join(reversed(known))}")


def create_if_missing(url: str, *, revision: str = "head", busy_timeout_s: float = 30.0) -> bool:
    """Create a SQLite store that does not exist yet at `revision` (the code's schema: the
    embedded default's first use needs no `vjob db upgrade`); True when this call made it.

    The file is built beside its place and linked in whole: a command racing this one finds
    no file or a complete one, and a failure leaves no file behind (an empty database would
    then be refused as "no vjob schema" by every later command). Only a missing file is
    created: an existing database at an older schema still asks for `vjob db upgrade`."""
    path = sqlite_file(url)
    try:
        if path is None or path.exists():
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"database {_safe_url(url)}: cannot create its directory: {exc.strerror}") from None
    tmp = path.with_name(f".{path.name}.new-{os.getpid()}")
    try:
        store = Store(
            make_url(url).set(database=str(tmp)).render_as_string(hide_password=False), busy_timeout_s=busy_timeout_s
        )
        try:
            store.upgrade(revision)
        finally:
            store.close()
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False  # another command made it first: theirs is as good
        except OSError as exc:
            raise StoreError(f"database {_safe_url(url)}: cannot create it: {exc.strerror}") from None
        return True
    finally:
        for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm"), Path(f"{tmp}-journal")):
            leftover.unlink(missing_ok=True)


def open_store(config: Any, *, check: bool = True) -> Store:
    """The store of `config`, schema-checked unless `check` is False (db commands); a SQLite
    store that does not exist yet is first created at the code's schema (`create_if_missing`)."""
    if check:
        create_if_missing(config.database_url, busy_timeout_s=config.database.busy_timeout_s)
    store = Store.from_config(config)
    if check:
        store.check()
    return store


def _legacy_revision(conn: Connection) -> str | None:
    """The vjob revision in LEGACY_VERSION_TABLE (the first one this code knows), or None."""
    if not inspect(conn).has_table(LEGACY_VERSION_TABLE):
        return None
    rows = conn.execute(text(f"SELECT version_num FROM {LEGACY_VERSION_TABLE}")).scalars().all()
    known = {rev.revision for rev in ScriptDirectory.from_config(_alembic_config("sqlite://")).walk_revisions()}
    return next((r for r in rows if r in known), None)


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    return str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
