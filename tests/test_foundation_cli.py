"""The `vjob` command as an operator runs it: real processes, real exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vjob import __version__


def vjob(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "VJOB_CONFIG"} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "vjob.cli", *args], capture_output=True, text=True, env=full, cwd=cwd, timeout=120
    )


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    return {"VJOB_DATA_DIR": str(tmp_path / "data")}


def test_version() -> None:
    r = vjob("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"vjob {__version__}"


def test_first_run_on_embedded_defaults(home: dict[str, str]) -> None:
    r = vjob("db", "check", env=home)
    assert r.returncode == 1 and "run 'vjob db upgrade'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, "an error is one line"
    assert vjob("db", "upgrade", env=home).returncode == 0
    assert vjob("db", "check", env=home).returncode == 0
    r = vjob("db", "current", env=home)
    assert "up to date" in r.stdout
    assert vjob("db", "downgrade", env=home).returncode == 0
    assert vjob("db", "check", env=home).returncode == 1


def test_bad_usage_exits_2() -> None:
    r = vjob("db", "frobnicate")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_bad_configuration_exits_2(tmp_path: Path, home: dict[str, str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[priority.weights]\ninteractive = -1\n")
    r = vjob("config", "check", str(bad))
    assert r.returncode == 2 and "priority.weights.interactive = -1" in r.stderr
    r = vjob("--config", str(bad), "db", "check", env=home)
    assert r.returncode == 2


def test_unreachable_database_exits_1_and_writes_nothing(tmp_path: Path) -> None:
    cfg = tmp_path / "vjob.toml"
    cfg.write_text('[database]\nurl = "postgresql://vjob:secret@127.0.0.1:1/vjob"\nconnect_timeout_s = 1\n')
    r = vjob("--config", str(cfg), "db", "upgrade")
    assert r.returncode == 1 and "unreachable" in r.stderr and "secret" not in r.stderr
    assert "Traceback" not in r.stderr
    r = vjob("--config", str(cfg), "--debug", "db", "upgrade")
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_config_show_masks_secrets(tmp_path: Path) -> None:
    cfg = tmp_path / "vjob.toml"
    cfg.write_text('[database]\nurl = "postgresql://vjob:secret@db/vjob"\n')
    for fmt in ("toml", "json"):
        r = vjob("--config", str(cfg), "config", "show", "--format", fmt)
        assert r.returncode == 0 and "secret" not in r.stdout and "***" in r.stdout


def test_config_show_is_valid_toml(home: dict[str, str]) -> None:
    import tomllib

    r = vjob("config", "show", env=home)
    data = tomllib.loads(r.stdout)
    assert data["priority"]["weights"]["interactive"] == 0.24
