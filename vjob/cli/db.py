"""`vjob db upgrade | downgrade | current | check`: the state store's schema."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vjob.cli import load_config
from vjob.errors import StoreError

if TYPE_CHECKING:
    from vjob.store.db import Store

# The store (SQLAlchemy, Alembic) is imported by the commands when they run, so that
# `vjob db --help` loads neither (issue 36).

EPILOG = """\
examples:
  vjob db upgrade                    after installing a new vjob (Alembic migrations)
  vjob db check && systemctl start vjob-agent
  vjob db current                    the database's revision and the code's
  vjob --config /etc/vjob/vjob.toml db downgrade 0003
  vjob db backup /var/backups/vjob-$(date +%F).db      safe while the agent runs
  vjob db restore /var/backups/vjob-2026-11-29.db      into an empty store (--force: replace)

The database is [database] url (SQLite under the data directory by default)."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "db",
        help="state store schema: upgrade, downgrade, current, check",
        description="Manage the state store's schema (Alembic migrations shipped with vjob).",
        epilog=EPILOG,
    )
    dbsub = p.add_subparsers(dest="db_command", metavar="ACTION", required=True)

    def action(name: str, help_text: str, description: str) -> Any:
        return dbsub.add_parser(name, help=help_text, description=description, epilog=EPILOG)

    up = action(
        "upgrade",
        "migrate the database to the newest schema (or REVISION)",
        "Create or migrate the database's tables up to REVISION (default: the code's head).",
    )
    up.add_argument("revision", nargs="?", default="head", help="Alembic revision to reach (default: head)")
    up.set_defaults(func=_upgrade)
    down = action(
        "downgrade",
        "migrate the database back to REVISION (default: base, empty)",
        "Migrate the database back to REVISION; base drops every vjob table (their data is lost).",
    )
    down.add_argument("revision", nargs="?", default="base", help="Alembic revision to go back to (default: base)")
    down.set_defaults(func=_downgrade)
    action(
        "current",
        "print the schema revision of the database",
        "Print the database's schema revision and whether it matches this vjob.",
    ).set_defaults(func=_current)
    action(
        "check",
        "exit 0 only if the database is at this vjob's schema",
        "Exit 0 when the database schema matches this vjob, 1 otherwise (what to run is said).",
    ).set_defaults(func=_check)
    bk = action(
        "backup",
        "write a consistent copy of vjob's tables to FILE (mode 0600)",
        "Copy the store to FILE while the agent may be writing: SQLite's online backup API for a "
        "SQLite store, a dump of vjob's tables from one snapshot for PostgreSQL (docs/operator.md).",
    )
    bk.add_argument("file", metavar="FILE", type=Path, help="where to write the backup (replaced whole)")
    bk.set_defaults(func=_backup)
    rs = action(
        "restore",
        "load a backup FILE into the store (all or nothing)",
        "Load a backup made by 'vjob db backup' into the store, in one transaction. Refuses a store "
        "that holds rows unless --force, and a backup of another schema than this vjob's unless "
        "--any-revision.",
    )
    rs.add_argument("file", metavar="FILE", type=Path, help="a backup written by 'vjob db backup'")
    rs.add_argument("--force", action="store_true", help="replace the rows the store already holds")
    rs.add_argument(
        "--any-revision",
        action="store_true",
        help="restore a backup of another schema revision (then run 'vjob db upgrade')",
    )
    rs.set_defaults(func=_restore)


def _store(args: argparse.Namespace) -> Store:
    """The configured store; a SQLite file that does not exist is refused (only `upgrade`
    creates one, through `create_if_missing`): reading it would leave an empty file behind."""
    from vjob.store.db import Store, sqlite_file  # heavy: sqlalchemy

    cfg = load_config(args)
    path = sqlite_file(cfg.database_url)
    if path is not None and not path.exists():
        raise StoreError(
            f"database {path} does not exist yet: the first command that needs it creates it, or run 'vjob db upgrade'"
        )
    return Store.from_config(cfg)


def _upgrade(args: argparse.Namespace) -> int:
    from vjob.store.db import Store, create_if_missing, known_revision  # heavy: sqlalchemy

    revision = known_revision(args.revision)
    cfg = load_config(args)
    made = create_if_missing(cfg.database_url, revision=revision, busy_timeout_s=cfg.database.busy_timeout_s)
    store = Store.from_config(cfg)
    if not made:
        store.upgrade(revision)
    print(f"database {store.safe_url} {'created at' if made else 'at'} schema {store.current_revision()}")
    return 0


def _downgrade(args: argparse.Namespace) -> int:
    from vjob.store.db import known_revision  # heavy: sqlalchemy

    store = _store(args)
    store.downgrade(known_revision(args.revision))
    print(f"database {store.safe_url} at schema {store.current_revision() or 'base (empty)'}")
    return 0


def _current(args: argparse.Namespace) -> int:
    from vjob.store.db import head_revision  # heavy: sqlalchemy

    store = _store(args)
    current = store.current_revision()
    head = head_revision()
    print(f"{current or 'base'} (code head {head}{', up to date' if current == head else ''})")
    return 0


def _check(args: argparse.Namespace) -> int:
    store = _store(args)
    rev = store.check()
    print(f"database {store.safe_url} is at schema {rev}: ok")
    return 0


def _backup(args: argparse.Namespace) -> int:
    from vjob.store.backup import backup  # heavy: sqlalchemy

    result = backup(_store(args), args.file)
    total = sum(result.rows.values())
    tables = len(result.rows)
    print(f"backup {result.path}: schema {result.revision}, {total} rows in {tables} tables ({result.format})")
    return 0


def _restore(args: argparse.Namespace) -> int:
    """Restore into the configured store; a SQLite file this command had to create is removed
    again when the restore fails (no empty store left behind)."""
    from vjob.store.backup import restore  # heavy: sqlalchemy
    from vjob.store.db import Store, head_revision, sqlite_file  # heavy: sqlalchemy

    cfg = load_config(args)
    path = sqlite_file(cfg.database_url)
    fresh = path is not None and not path.exists()
    store = Store.from_config(cfg)
    try:
        result = restore(store, args.file, force=args.force, any_revision=args.any_revision)
    except BaseException:
        store.close()
        if fresh and path is not None:
            for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                leftover.unlink(missing_ok=True)
        raise
    total = sum(result.rows.values())
    print(f"database {store.safe_url} restored from {result.path}: schema {result.revision}, {total} rows")
    if result.revision != head_revision():
        print("the backup's schema is older than this vjob's: run 'vjob db upgrade'", file=sys.stderr)
    return 0
