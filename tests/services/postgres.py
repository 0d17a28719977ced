"""A private PostgreSQL cluster for the tests, made with Debian's postgresql tools.

`VJOB_TEST_POSTGRES_URL` (a server you run yourself) skips all of this. Otherwise a cluster
is created with pg_createcluster on a free port under a temporary directory, started with
pg_ctlcluster, used by every `postgres` test of the run, and at the end stopped by the pid in
its postmaster.pid and dropped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.services import free_port, stop_pid, wait_for

VERSION = "15"


def _run(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, text=True, timeout=120)


def _ready(port: int) -> bool:
    return (
        subprocess.run(
            [f"/usr/lib/postgresql/{VERSION}/bin/pg_isready", "-h", "127.0.0.1", "-p", str(port)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The URL of a superuser connection to a running PostgreSQL (started if needed)."""
    given = os.environ.get("VJOB_TEST_POSTGRES_URL")
    if given:
        yield given
        return
    if shutil.which("pg_createcluster") is None:
        raise RuntimeError("pg_createcluster not found: apt-get install postgresql (see .ci/run)")
    port = free_port()
    name = f"vjobtest{port}"
    base = Path(tempfile.mkdtemp(prefix="vjob-pg-"))
    os.chmod(base, 0o755)
    password = uuid.uuid4().hex
    try:
        start_cluster(name, port, base / "data", password)
        yield f"postgresql+psycopg://postgres:{password}@127.0.0.1:{port}/postgres"
    finally:
        drop_cluster(name, base / "data")
        shutil.rmtree(base, ignore_errors=True)


def start_cluster(name: str, port: int, data: Path, password: str) -> int:
    """Create and start a private cluster `name` on `port` in `data`, with `password` for the
    postgres superuser over TCP; returns the postmaster's pid (stop it with drop_cluster)."""
    _run(
        "pg_createcluster",
        VERSION,
        name,
        "-p",
        str(port),
        "-d",
        str(data),
        "--",
        "--auth-local=trust",
        "--auth-host=scram-sha-256",
        "-E",
        "UTF8",
    )
    _run("pg_ctlcluster", VERSION, name, "start")
    wait_for(lambda: _ready(port), 60, f"PostgreSQL on port {port}")
    _run(
        "runuser",
        "-u",
        "postgres",
        "--",
        "psql",
        "-p",
        str(port),
        "-h",
        "/var/run/postgresql",
        "-qc",
        f"ALTER USER postgres PASSWORD '{password}'",
    )
    return int((data / "postmaster.pid").read_text().split()[0])


def drop_cluster(name: str, data: Path) -> None:
    """Stop the cluster by the pid in its postmaster.pid, then drop it (idempotent)."""
    pidfile = data / "postmaster.pid"
    if pidfile.exists():
        stop_pid(int(pidfile.read_text().split()[0]))
    subprocess.run(["pg_dropcluster", VERSION, name], capture_output=True, check=False, timeout=60)


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A fresh, empty database on the shared server for one test, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = postgres_server.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
