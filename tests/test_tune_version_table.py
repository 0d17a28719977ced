"""vjob's Alembic version table beside an Optuna study, in one database (SQLite and PostgreSQL).

Before issue 18 both kept their revision in `alembic_version`: whichever came first broke the
other. vjob now keeps `vjob_alembic_version`; `vjob db upgrade` moves an old install's row.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from sqlalchemy import inspect, text

from vjob.cli import main
from vjob.errors import SchemaOutdatedError
from vjob.store.db import LEGACY_VERSION_TABLE, VERSION_TABLE, Store, head_revision

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _as_before_issue_18(store: Store) -> None:
    """Put the database in the state an older vjob left it: its revision in alembic_version."""
    head = head_revision()
    with store.engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {VERSION_TABLE}"))
        conn.execute(text(f"CREATE TABLE {LEGACY_VERSION_TABLE} (version_num VARCHAR(32) NOT NULL PRIMARY KEY)"))
        conn.execute(text(f"INSERT INTO {LEGACY_VERSION_TABLE} VALUES (:v)"), {"v": head})


def _optuna_works(url: str, name: str) -> None:
    study = optuna.create_study(study_name=name, storage=url, load_if_exists=True)
    study.optimize(lambda t: (t.suggest_float("x", -1, 1)) ** 2, n_trials=2)
    again = optuna.load_study(study_name=name, storage=url)
    assert len(again.trials) >= 2


def test_fresh_install_uses_its_own_version_table(db_url: str) -> None:
    store = Store(db_url)
    store.upgrade()
    tables = set(inspect(store.engine).get_table_names())
    assert VERSION_TABLE in tables and LEGACY_VERSION_TABLE not in tables
    assert store.check() == head_revision()
    store.close()


def test_old_install_is_refused_then_moved_by_upgrade(db_url: str) -> None:
    store = Store(db_url)
    store.upgrade()
    _as_before_issue_18(store)
    with pytest.raises(SchemaOutdatedError, match=r"vjob db upgrade.*moves it to vjob_alembic_version"):
        store.check()
    store.upgrade()
    assert store.check() == head_revision()
    assert LEGACY_VERSION_TABLE not in inspect(store.engine).get_table_names()  # free for Optuna
    store.upgrade()  # idempotent
    assert store.check() == head_revision()
    store.close()


def test_optuna_first_then_vjob(db_url: str) -> None:
    """The collision of the issue: Optuna's revision in alembic_version made vjob's upgrade fail."""
    _optuna_works(db_url, "before")
    store = Store(db_url)
    assert store.legacy_revision() is None  # Optuna's revision is not mistaken for vjob's
    store.upgrade()
    assert store.check() == head_revision()
    _optuna_works(db_url, "before")
    _optuna_works(db_url, "after")
    store.close()


def test_old_vjob_then_upgrade_then_optuna(db_url: str) -> None:
    store = Store(db_url)
    store.upgrade()
    _as_before_issue_18(store)
    store.upgrade()
    _optuna_works(db_url, "study")
    assert store.check() == head_revision()
    store.downgrade("-1")
    store.upgrade()  # migrations still run with Optuna's tables in the same database
    assert store.check() == head_revision()
    _optuna_works(db_url, "study")
    store.close()


def test_vjob_db_upgrade_command_moves_the_version(db_url: str, tmp_path: Path) -> None:
    store = Store(db_url)
    store.upgrade()
    _as_before_issue_18(store)
    cfg = tmp_path / "vjob.toml"
    cfg.write_text(f'[database]\nurl = "{db_url}"\n')
    assert main(["--config", str(cfg), "db", "check"]) == 1
    assert main(["--config", str(cfg), "db", "upgrade"]) == 0
    assert main(["--config", str(cfg), "db", "check"]) == 0
    store.close()
