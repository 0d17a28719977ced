"""`vjob db upgrade | downgrade | current | check`: the state store's schema."""

from __future__ import annotations

import argparse
from typing import Any

from vjob.cli import load_config
from vjob.store.db import Store, head_revision


def register(sub: Any) -> None:
    p = sub.add_parser("db", help="state store schema: upgrade, downgrade, current, check")
    dbsub = p.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = dbsub.add_parser("upgrade", help="migrate the database to the newest schema (or REVISION)")
    up.add_argument("revision", nargs="?", default="head")
    up.set_defaults(func=_upgrade)
    down = dbsub.add_parser("downgrade", help="migrate the database back to REVISION (default: base, empty)")
    down.add_argument("revision", nargs="?", default="base")
    down.set_defaults(func=_downgrade)
    dbsub.add_parser("current", help="print the schema revision of the database").set_defaults(func=_current)
    dbsub.add_parser("check", help="exit 0 only if the database is at this vjob's schema").set_defaults(func=_check)


def _store(args: argparse.Namespace) -> Store:
    return Store.from_config(load_config(args))


def _upgrade(args: argparse.Namespace) -> int:
    store = _store(args)
    store.upgrade(args.revision)
    print(f"database {store.safe_url} at schema {store.current_revision()}")
    return 0


def _downgrade(args: argparse.Namespace) -> int:
    store = _store(args)
    store.downgrade(args.revision)
    print(f"database {store.safe_url} at schema {store.current_revision() or 'base (empty)'}")
    return 0


def _current(args: argparse.Namespace) -> int:
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
