"""numba's cache for an ordinary user with nowhere to write it (issue 34 item 4's `vjob prio
--users` as `nobody` failed with "no locator available"): vjob.jit points NUMBA_CACHE_DIR at a
private directory of the user's, never at one another user made or can write (numba's cache
files are pickles: loading another user's runs their code)."""

from __future__ import annotations

import os
import pwd
import stat
import tempfile
from pathlib import Path

import pytest

from tests.as_user import as_nobody
from vjob import jit


def _nobody() -> int:
    return pwd.getpwnam("nobody").pw_uid


def test_the_users_own_private_directory_is_made_then_reused(tmp_path: Path) -> None:
    first = jit.private_cache_dir(os.geteuid(), tmp_path)
    assert first == tmp_path / f"vjob-numba-{os.geteuid()}"
    assert stat.S_IMODE(first.stat().st_mode) == 0o700
    assert jit.private_cache_dir(os.geteuid(), tmp_path) == first


def test_a_directory_someone_else_prepared_is_never_used(tmp_path: Path) -> None:
    uid = os.geteuid()
    planted = tmp_path / f"vjob-numba-{uid}"
    planted.mkdir(mode=0o700)
    os.chown(planted, _nobody(), -1)  # made by another user
    got = jit.private_cache_dir(uid, tmp_path)
    assert got != planted and got.stat().st_uid == uid and not got.stat().st_mode & 0o077
    os.chown(planted, uid, -1)
    planted.chmod(0o777)  # the user's, but anyone may write into it
    assert jit.private_cache_dir(uid, tmp_path) != planted
    planted.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    planted.symlink_to(elsewhere)  # a link to a directory of the right owner and mode
    assert jit.private_cache_dir(uid, tmp_path) not in (planted, elsewhere)


def test_only_a_user_with_no_writable_place_gets_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    top = Path(tempfile.mkdtemp(prefix="vjob-jit-", dir="/var/tmp"))
    try:
        top.chmod(0o755)
        package = top / "pkg"
        package.mkdir(mode=0o755)  # root's, as an installed vjob
        assert jit._cache_dir_needed(package, top) is False  # root may write the tree
        res = as_nobody(lambda: 0 if jit._cache_dir_needed(package, Path("/nonexistent")) else 1)
        assert res.returncode == 0, res.stderr
        home = top / "home"
        home.mkdir()
        os.chown(home, _nobody(), -1)
        res = as_nobody(lambda: 1 if jit._cache_dir_needed(package, home) else 0)  # ~/.cache can be made
        assert res.returncode == 0, res.stderr
    finally:
        for p in sorted(top.rglob("*"), reverse=True):
            p.rmdir()
        top.rmdir()
