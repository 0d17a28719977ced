"""Shared fixtures: the real services (tests/services/*) and a store on each database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from vjob.store.db import Store

pytest_plugins = [
    "tests.services.postgres",
    "tests.services.oar",
    "tests.services.libvirt",
    "tests.services.slurm",
]

TESTS = Path(__file__).resolve().parent
"""tests/: its data/ folder holds the recorded command outputs and traces (see data/README.md)."""


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The folder whose `data/` holds the recorded outputs and traces: the repository's own copy
    (tests/data) of the project's shared data, so a plain clone passes its tests."""
    return TESTS


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database URL, once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'vjob.sqlite'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A store at the newest schema, on SQLite and on PostgreSQL."""
    s = Store(db_url)
    s.upgrade()
    yield s
    s.close()
