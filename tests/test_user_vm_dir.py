"""`[provisioning] user_vm_dir`: a user's node-local VM directory in a parent every user may
write (mode 1777) is used only when it is that user's own, not a symlink, nobody else may write
it, and it is made private (0700)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pilot.specs import user_vm_base
from provisioning.safe_dirs import UnsafePathError
from vjob.config import ProvisioningConfig


def _config(parent: Path) -> ProvisioningConfig:
    return ProvisioningConfig(user_vm_dir=str(parent / "{user}"))


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    shared = tmp_path / "local"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


def _mine(parent: Path) -> Path:
    import pwd

    return parent / pwd.getpwuid(os.geteuid()).pw_name


def test_made_private_when_missing(parent: Path) -> None:
    base = user_vm_base(_config(parent))
    assert base == _mine(parent)
    st = os.lstat(base)
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o700


def test_a_symlink_planted_in_the_shared_parent_is_refused(parent: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir(mode=0o777)
    _mine(parent).symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match="is a symlink"):
        user_vm_base(_config(parent))


def test_a_directory_someone_else_made_first_is_refused(parent: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test makes a directory owned by another uid: run it as root")
    _mine(parent).mkdir(mode=0o700)
    os.chown(_mine(parent), 65534, 65534)
    with pytest.raises(UnsafePathError, match="is owned by uid 65534"):
        user_vm_base(_config(parent))


def test_an_own_directory_others_can_read_is_made_private(parent: Path) -> None:
    _mine(parent).mkdir()
    _mine(parent).chmod(0o755)
    assert os.lstat(user_vm_base(_config(parent))).st_mode & 0o777 == 0o700


def test_an_own_directory_others_can_write_is_refused(parent: Path) -> None:
    _mine(parent).mkdir()
    _mine(parent).chmod(0o777)
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        user_vm_base(_config(parent))
