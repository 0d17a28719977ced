"""Shared fixtures: the real services (tests/services/*) and a store on each database."""

from __future__ import annotations

import fcntl
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
    `derandomize=False`, or settings built before this profile was loaded): CI stays repeatable.
    Also refuse a service fixture used without a service marker."""
    _refuse_unmarked_service_use(items)
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


SERVICE_FIXTURES = frozenset(
    {
        "postgres_server",
        "postgres_url",
        "slurm_cluster",
        "slurm_adapter",
        "node_service",
        "two_host_cluster",
        "libvirt_system",
        "libvirt_second_node",
        "second_host",
        "second_host_over_wire",
        "oar_cluster",
    }
)
"""Fixtures of tests/services/ that start a real, machine-wide service when it is not running."""
SERVICE_MARKERS = frozenset({"postgres", "slurm", "libvirt", "realvm", "oar"})


def _refuse_unmarked_service_use(items: list[pytest.Item]) -> None:
    """Refuse a test that takes a service fixture without a service marker. Why: .ci/run runs the
    unmarked tests on two pytest-xdist workers, where a shared service (the dev cluster, libvirtd,
    OAR) could be started by both at once; their marked tests run serially, in one process. (The
    postgres-marked tests do run there: each pytest process makes its own private server.)"""
    unmarked = [
        f"{item.nodeid} (uses {', '.join(sorted(used))})"
        for item in items
        if (used := SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())))
        and not SERVICE_MARKERS.intersection(m.name for m in item.iter_markers())
    ]
    if unmarked:
        raise pytest.UsageError(f"tests using a real service without a service marker: {'; '.join(unmarked)}")


HOST_NETWORK_LOCK = "/tmp/vjob-host-network.lock"


@pytest.fixture(scope="module", autouse=True)
def _one_host_network_module_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """Hold HOST_NETWORK_LOCK through a module marked `host_network` (its module-scoped set-up
    included). Why: those modules make bridges, taps and firewall rules in this host's namespace
    and sweep away what they do not claim; .ci/run runs them on two pytest-xdist workers (and
    another checkout's run may share the machine), so two of them must not overlap. A lock and
    not pytest-xdist's `xdist_group`: under pytest 9.2, xdist 3.8's group suffix on the node id
    is lost (pytest keeps the id in `_id`), and the group would silently split."""
    if request.node.get_closest_marker("host_network") is None:
        yield
        return
    fd = os.open(HOST_NETWORK_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


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
