"""`[database] password_file`: the database password in a file of its own or a systemd
credential, checked (owner, mode), filled into the URL, never printed."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from plugins import deploy
from tests import local_users
from tests.as_user import as_nobody
from vjob.config import load, masked
from vjob.errors import ConfigError
from vjob.store.db import Store

SECRET = "s3cr:et@p/w%d"
"""A password with every character a URL must encode."""
URL = "postgresql://vjob@127.0.0.1:5432/vjob"
REPO = Path(__file__).resolve().parents[1]


def _config(tmp_path: Path, password_file: str, url: str = URL) -> Path:
    cfg = tmp_path / "vjob.toml"
    cfg.write_text(f'[database]\nurl = "{url}"\npassword_file = "{password_file}"\n')
    return cfg


def _secret(path: Path, mode: int = 0o600, text: str = SECRET + "\n") -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_password_is_filled_into_the_url(tmp_path: Path) -> None:
    cfg = load(_config(tmp_path, str(_secret(tmp_path / "pw"))))
    url = make_url(cfg.database_url)
    assert url.password == SECRET and url.username == "vjob" and url.host == "127.0.0.1"


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o602, 0o666])
def test_a_file_others_can_use_is_refused_naming_path_and_mode(tmp_path: Path, mode: int) -> None:
    path = _secret(tmp_path / "pw", mode)
    cfg = load(_config(tmp_path, str(path)))
    with pytest.raises(ConfigError) as err:
        _ = cfg.database_url
    assert str(path) in str(err.value) and f"{mode:04o}" in str(err.value) and "chmod 600" in str(err.value)
    assert SECRET not in str(err.value)


def test_group_readable_is_accepted(tmp_path: Path) -> None:
    cfg = load(_config(tmp_path, str(_secret(tmp_path / "pw", 0o640))))
    assert make_url(cfg.database_url).password == SECRET


def test_a_file_of_another_user_is_refused(tmp_path: Path) -> None:
    path = _secret(tmp_path / "pw")
    os.chown(path, local_users.ensure("vjobtest").pw_uid, -1)
    cfg = load(_config(tmp_path, str(path)))
    with pytest.raises(ConfigError, match=r"owned by uid \d+ \(vjobtest\), neither root nor"):
        _ = cfg.database_url


def test_links_and_odd_files_are_refused(tmp_path: Path) -> None:
    target = _secret(tmp_path / "pw")
    (tmp_path / "link").symlink_to(target)
    os.mkfifo(tmp_path / "fifo", 0o600)
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "empty").chmod(0o600)
    for name, says in (("link", "symbolic link"), ("fifo", "not a regular file"), ("empty", "first line is empty")):
        with pytest.raises(ConfigError, match=says):
            _ = load(_config(tmp_path, str(tmp_path / name))).database_url
    with pytest.raises(ConfigError, match="cannot be read: No such file"):
        _ = load(_config(tmp_path, str(tmp_path / "missing"))).database_url


def test_the_file_is_read_as_the_running_user() -> None:
    """As `nobody`: its own 0600 file is read; root's 0600 file cannot be, and says so; a
    configuration naming root's file still loads (a pilot reads vjob.toml and never the password),
    and `masked` shows it without reading it."""
    with tempfile.TemporaryDirectory(prefix="vjob-pwfile-") as where:  # pytest's tmp is root's only
        base = Path(where)
        base.chmod(0o755)
        _read_as_nobody(base)


def _read_as_nobody(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    own = _secret(tmp_path / "own")
    os.chown(own, nobody.pw_uid, nobody.pw_gid)
    root_only = _secret(tmp_path / "root-only")
    (tmp_path / "a").mkdir(mode=0o755)
    (tmp_path / "b").mkdir(mode=0o755)
    own_cfg, root_cfg = _config(tmp_path / "a", str(own)), _config(tmp_path / "b", str(root_only))

    def work() -> int:
        assert make_url(load(own_cfg).database_url).password == SECRET
        cfg = load(root_cfg)
        print(json.dumps(masked(cfg)["database"]))
        try:
            _ = cfg.database_url
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return 3
        return 0

    done = as_nobody(work)
    assert done.returncode == 3, done.stderr
    assert f"{root_only} cannot be read: Permission denied" in done.stderr
    shown = json.loads(done.stdout)
    assert shown["password_file"] == str(root_only)
    assert shown["effective_url"] == "postgresql://vjob:***@127.0.0.1:5432/vjob"


def test_a_systemd_credential_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    creds = tmp_path / "creds"
    creds.mkdir(mode=0o700)
    _secret(creds / "vjob-db-password", 0o400, SECRET)
    cfg = load(_config(tmp_path, "vjob-db-password"))
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    with pytest.raises(ConfigError, match=r"\$CREDENTIALS_DIRECTORY, which is not set.*LoadCredential="):
        _ = cfg.database_url
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    assert make_url(cfg.database_url).password == SECRET


@pytest.mark.parametrize(
    ("url", "value", "says"),
    [
        ("postgresql://vjob:inline@db/vjob", "/etc/vjob/db-password", "holds a password already"),
        ("", "/etc/vjob/db-password", "needs a database url"),
        ("sqlite:////tmp/x.sqlite", "/etc/vjob/db-password", "needs a database url"),
        (URL, "creds/pw", "absolute path, or a bare credential name"),
    ],
)
def test_bad_settings_are_refused_at_load(tmp_path: Path, url: str, value: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as err:
        load(_config(tmp_path, value, url))
    assert "database.password_file" in str(err.value) and "inline" not in str(err.value)


def test_config_show_never_prints_it(tmp_path: Path) -> None:
    cfg = _config(tmp_path, str(_secret(tmp_path / "pw")))
    for fmt in ("toml", "json"):
        done = subprocess.run(
            [sys.executable, "-m", "vjob.cli", "--config", str(cfg), "config", "show", "--format", fmt],
            capture_output=True,
            text=True,
            check=True,
        )
        assert SECRET not in done.stdout and "s3cr" not in done.stdout
        assert str(tmp_path / "pw") in done.stdout and "vjob:***@127.0.0.1" in done.stdout


@pytest.mark.postgres
def test_the_agent_user_connects_to_postgresql_with_it(postgres_url: str, tmp_path: Path) -> None:
    """A real server: the URL without password plus the file open the store; a wrong password
    in the file fails without printing it."""
    parsed = make_url(postgres_url)
    password = parsed.password or ""
    bare = parsed._replace(password=None).render_as_string(hide_password=False)
    cfg = load(_config(tmp_path, str(_secret(tmp_path / "pw", text=password + "\n")), bare))
    store = Store.from_config(cfg)
    store.upgrade()
    assert store.current_revision() is not None
    assert password not in store.safe_url
    store.close()
    wrong = load(_config(tmp_path, str(_secret(tmp_path / "pw", text="Wr0ngPass\n")), bare))
    with pytest.raises(Exception, match="password authentication failed") as err:
        Store.from_config(wrong).ping()
    assert "Wr0ngPass" not in str(err.value)


UNIT_LINE = "LoadCredential=vjob-db-password:/etc/vjob/db-password"
"""The line docs/operator.md tells the operator to add to vjob-agent.service ([Service])."""


@pytest.mark.parametrize(("line", "accepted"), [(UNIT_LINE, True), ("LoadCredentials=vjob-db-password:/x", False)])
def test_systemd_accepts_the_documented_unit_line(tmp_path: Path, line: str, accepted: bool) -> None:
    """The shipped agent unit with the documented line still passes `systemd-analyze verify`
    (a misspelt key does not: the check reads the line)."""
    assert shutil.which("systemd-analyze"), "systemd-analyze missing: apt-get install systemd"
    assert UNIT_LINE in (REPO / "docs" / "operator.md").read_text()
    man1 = tmp_path / "man" / "man1"
    man1.mkdir(parents=True)
    deploy.install(deploy.find("man-page"), man1)
    path, _ = deploy.install(deploy.find("agent-unit"), tmp_path)
    path.write_text(path.read_text().replace("[Service]\n", f"[Service]\n{line}\n", 1))
    env = {**os.environ, "MANPATH": str(tmp_path / "man")}
    done = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60, env=env)
    assert (done.returncode == 0 and done.stderr.strip() == "") is accepted, done.stderr
