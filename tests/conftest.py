"""Shared fixtures: the real services (tests/services/*) and a store on each database."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from vjob.store.db import Store

pytest_plugins = [
    "tests.services.postgres",
    "tests.services.oar",
    "tests.services.libvirt",
    "tests.services.slurm",
    "tests.services.node_service",
]

# Hypothesis profiles, loaded here (before any test module builds its own `settings(...)`, which
# inherit whatever a test does not set). Why "ci" by default: a test that draws new cases on
# every run fails on somebody else's change one day and passes on the retry the next, so CI
# and a developer's run see the same fixed sequence of cases (derandomize implies no example
# database). Why no deadline and no too_slow health check: both are wall-clock bounds, which
# fail on 2 loaded shared cores and prove nothing about the code (speed belongs in bench/).
# "random" draws new cases each run (and keeps failures in .hypothesis/) for soak runs:
#   HYPOTHESIS_PROFILE=random .venv/bin/pytest tests/test_deadline_policies.py
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("random", derandomize=False, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HYPOTHESIS_PROFILE = "ci" if os.environ.get("CI") else (os.environ.get("HYPOTHESIS_PROFILE") or "ci")
""""ci" whenever `CI` is set (CI services set CI=true; `HYPOTHESIS_PROFILE` is then ignored) and
by default; else the profile `HYPOTHESIS_PROFILE` names."""
settings.load_profile(HYPOTHESIS_PROFILE)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under "ci", refuse a Hypothesis test whose own settings draw random cases (an explicit
    `derandomize=False`, or settings built before this profile was loaded): CI stays repeatable."""
    if HYPOTHESIS_PROFILE != "ci":
        return
    random = [
        item.nodeid
        for item in items
        if (s := getattr(getattr(item, "obj", None), "_hypothesis_internal_use_settings", None)) is not None
        and not s.derandomize
    ]
    if random:
        raise pytest.UsageError(f"Hypothesis tests drawing random cases under the ci profile: {', '.join(random)}")


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
