"""Alembic environment: runs migrations on the engine vjob itself would use."""

from __future__ import annotations

from alembic import context

from vjob.store.db import VERSION_TABLE, make_engine
from vjob.store.schema import Base

config = context.config
target_metadata = Base.metadata


def _ours(name: str | None, type_: str, _parent: dict[str, str | None]) -> bool:
    """Autogenerate compares vjob's tables only: the database may also hold an Optuna study."""
    return type_ != "table" or name in target_metadata.tables


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        version_table=VERSION_TABLE,
        include_name=_ours,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    assert url is not None
    engine = make_engine(url)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
            version_table=VERSION_TABLE,
            include_name=_ours,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
