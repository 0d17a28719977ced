"""A raw `@` in the database password (issue 39, item 13).

`postgresql://vjob:PASS@WORD@db/vjob` was read as password `PASS`, host `WORD@db`: every agent
tick failed to resolve that "host" and quoted it in its error. The configuration now refuses
such a URL at load, in one line naming `database.url`, with the password masked; and a store
opened on one anyway (the URL given in code) still never prints any piece of it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from vjob import log
from vjob.config import load, parse
from vjob.errors import ConfigError, StoreError
from vjob.store.db import Store

HEAD, TAIL = "Hq7zPw", "Tail9xQ"
"""The two halves of the password around its raw '@': neither may be printed."""
RAW_URL = f"postgresql://vjob:{HEAD}@{TAIL}@127.0.0.1:1/vjob"
REPO = Path(__file__).resolve().parents[1]


def _assert_no_secret(output: str) -> None:
    for piece in (HEAD, TAIL, f"{HEAD}@{TAIL}"):
        assert piece not in output, output


def test_loading_a_raw_at_password_is_one_masked_line_naming_the_field(tmp_path: Path) -> None:
    cfg = tmp_path / "vjob.toml"
    cfg.write_text(f'[database]\nurl = "{RAW_URL}"\n')
    with pytest.raises(ConfigError) as err:
        load(cfg)
    message = str(err.value)
    assert "database.url" in message and "%40" in message and "\n" not in message
    assert "postgresql://vjob:***@127.0.0.1:1/vjob" in message
    _assert_no_secret(message)


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://vjob:{HEAD}@{TAIL}@db/vjob",
        f"postgresql://vjob:{HEAD}@{TAIL}@@db/vjob",
        f"postgresql+psycopg://vjob:{HEAD} @{TAIL}'@db:5432/vjob?sslmode=require",
        f"postgresql://vj@ob:{HEAD}@db/vjob",  # in the user name: refused too
    ],
)
def test_every_raw_at_in_the_userinfo_is_refused_without_echo(url: str) -> None:
    with pytest.raises(ConfigError, match=r"database\.url = .*%40") as err:
        parse({"database": {"url": url}})
    _assert_no_secret(str(err.value))


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://vjob:{HEAD}%40{TAIL}@db/vjob",  # what the error says to write
        "sqlite:////var/lib/a@b/vjob.sqlite",  # an '@' in a path is no userinfo
        "postgresql://vjob@db/vjob",
        "",
    ],
)
def test_urls_without_a_raw_at_in_the_userinfo_load(url: str) -> None:
    assert parse({"database": {"url": url}}).database.url == url


def test_the_agent_and_db_commands_refuse_it_in_one_line_on_stderr(tmp_path: Path) -> None:
    """What the operator of the agent's unit sees: one line, exit 2, no traceback, no secret."""
    cfg = tmp_path / "vjob.toml"
    cfg.write_text(f'[database]\nurl = "{RAW_URL}"\nconnect_timeout_s = 1\n')
    env = {k: v for k, v in os.environ.items() if k != "VJOB_CONFIG"}
    env["PYTHONPATH"] = str(REPO)  # this tree's vjob, whatever the venv's install points at
    for args in (["agent", "--rms", "slurm", "--once"], ["db", "check"], ["config", "show"]):
        r = subprocess.run(
            [sys.executable, "-m", "vjob.cli", "--config", str(cfg), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            cwd=tmp_path,
        )
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and "database.url" in r.stderr and "Traceback" not in r.stderr
        _assert_no_secret(r.stdout + r.stderr)


def test_a_store_failure_on_a_raw_at_url_logs_no_piece_of_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Defence in depth: a Store opened on the URL directly (not through the configuration)
    fails as the agent's tick did, and the line it logs holds neither half of the password."""
    log.configure("info", "json")
    store = Store(RAW_URL, connect_timeout_s=1)
    with pytest.raises(StoreError) as err:
        with store.session("record the targets") as s:
            s.execute(text("SELECT 1"))
    log.get("agent").error("state store unavailable", error=str(err.value))
    store.close()
    captured = capsys.readouterr()
    assert "state store unavailable" in captured.err and "record the targets" in captured.err
    assert "\n" not in str(err.value)
    _assert_no_secret(captured.err + captured.out + str(err.value))
