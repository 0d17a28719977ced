"""The embedded default's first use: a SQLite store that does not exist yet is created at the
code's schema by the first command that needs it, whole or not at all; a command that fails
(a typo in a revision, a read of a store that is not there) leaves no file behind; an existing
store at an older schema still asks for `vjob db upgrade` (issue 36, item 3)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.as_user import as_nobody
from vjob.config import load
from vjob.errors import SchemaOutdatedError, StoreError
from vjob.store import db
from vjob.store.db import Store, create_if_missing, head_revision, open_store

REPO = Path(__file__).resolve().parents[1]


def _vjob(conf: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vjob.cli", "--config", str(conf), *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _site(tmp_path: Path) -> tuple[Path, Path]:
    conf = tmp_path / "vjob.toml"
    conf.write_text(f'data_dir = "{tmp_path / "data"}"\n')
    return conf, tmp_path / "data" / "vjob.sqlite"


def _files(where: Path) -> list[str]:
    return sorted(p.name for p in where.iterdir()) if where.exists() else []


def test_the_first_command_creates_the_store_at_the_codes_schema(tmp_path: Path) -> None:
    conf, path = _site(tmp_path)
    res = _vjob(conf, "image", "list")
    assert res.returncode == 0, res.stderr
    assert _files(path.parent) == ["vjob.sqlite"]  # nothing half made beside it
    store = Store(f"sqlite:///{path}")
    assert store.current_revision() == head_revision()
    store.close()
    assert _vjob(conf, "db", "check").returncode == 0


def test_first_commands_racing_get_one_complete_store(tmp_path: Path) -> None:
    conf, path = _site(tmp_path)
    code = "import sys; from vjob.config import load; from vjob.store.db import open_store as o; o(load(sys.argv[1]))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(conf)], cwd=REPO, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert _files(path.parent) == ["vjob.sqlite"]
    store = Store(f"sqlite:///{path}")
    assert store.current_revision() == head_revision()
    store.close()


def test_a_failed_creation_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, path = _site(tmp_path)

    def broken(self: Store, revision: str = "head") -> None:
        raise StoreError("disk full (simulated)")

    monkeypatch.setattr(Store, "upgrade", broken)
    with pytest.raises(StoreError, match="disk full"):
        create_if_missing(f"sqlite:///{path}")
    assert _files(path.parent) == []


def test_a_typo_in_a_revision_is_a_usage_error_and_touches_nothing(tmp_path: Path) -> None:
    conf, path = _site(tmp_path)
    res = _vjob(conf, "db", "upgrade", "nosuchrev")
    assert res.returncode == 2
    assert "revision 'nosuchrev': unknown" in res.stderr and "Error" not in res.stderr
    assert not path.exists()


@pytest.mark.parametrize("action", [["check"], ["current"], ["downgrade", "0001"]])
def test_reading_a_store_that_is_not_there_says_so_and_creates_nothing(tmp_path: Path, action: list[str]) -> None:
    conf, path = _site(tmp_path)
    res = _vjob(conf, "db", *action)
    assert res.returncode == 1
    assert f"database {path} does not exist yet" in res.stderr
    assert not path.exists()


def test_an_older_store_still_asks_for_an_upgrade(tmp_path: Path) -> None:
    conf, _ = _site(tmp_path)
    assert _vjob(conf, "db", "upgrade").returncode == 0
    assert _vjob(conf, "db", "downgrade", "-1").returncode == 0
    with pytest.raises(SchemaOutdatedError, match="run 'vjob db upgrade'"):
        open_store(load(conf))
    res = _vjob(conf, "image", "list")
    assert res.returncode == 1 and "older than" in res.stderr


def test_an_ordinary_users_first_command_makes_a_store_of_their_own(tmp_path: Path) -> None:
    """As `nobody`, in a directory that user owns: the store is theirs; where they may not look,
    a StoreError saying so (the CLI's one line), not a traceback."""
    top = Path(tempfile.mkdtemp(prefix="vjob-firstuse-", dir="/var/tmp"))
    top.chmod(0o755)  # pytest's own directories are root's alone
    home = top / "home"
    home.mkdir()
    os.chown(home, *_nobody_ids())
    try:
        _as_nobody_in(home)
    finally:
        shutil.rmtree(top)
    res = as_nobody(lambda: 0 if create_if_missing(f"sqlite:///{tmp_path / 'x.sqlite'}") else 1)
    assert res.returncode == 70 and "StoreError" in res.stderr and "Permission denied" in res.stderr


def _as_nobody_in(home: Path) -> None:
    url = f"sqlite:///{home / 'data' / 'vjob.sqlite'}"
    done = as_nobody(lambda: 0 if create_if_missing(url) else 1)
    assert done.returncode == 0, done.stderr
    made = home / "data" / "vjob.sqlite"
    assert (made.stat().st_uid, made.stat().st_gid) == _nobody_ids()
    assert _files(made.parent) == ["vjob.sqlite"]


def test_only_a_sqlite_file_is_ever_created() -> None:
    assert db.sqlite_file("sqlite://") is None and db.sqlite_file("sqlite:///:memory:") is None
    assert db.sqlite_file("postgresql://u@h/db") is None
    assert not create_if_missing("postgresql+psycopg://u@127.0.0.1:1/none")


def _nobody_ids() -> tuple[int, int]:
    import pwd

    pw = pwd.getpwnam("nobody")
    return pw.pw_uid, pw.pw_gid
