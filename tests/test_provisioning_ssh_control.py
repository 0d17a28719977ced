"""Shared ssh connections (provisioning.transfer): where the control socket lives and when it is
refused. Needs no ssh server: the real ssh resolves the options (`ssh -G`) and answers `-O`
requests without connecting. Sharing over a real connection, a dead master and closing are in
tests/test_multinode_remote_files.py (the second host)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioning import transfer
from vjob import proc

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root's control directory (transfer.CONTROL_DIR)")


@pytest.fixture
def control(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short private base directory (tmp_path is too long for a socket path): <base>/run/ssh."""
    base = Path(tempfile.mkdtemp(prefix="vj-", dir="/tmp"))
    where = base / "run" / "ssh"
    monkeypatch.setattr(transfer, "CONTROL_DIR", where)
    monkeypatch.setattr(transfer, "SHARE_CONNECTIONS", True)
    monkeypatch.setattr(transfer, "_warned", set())
    monkeypatch.setattr(transfer, "_shared", set())
    monkeypatch.delenv(transfer.SSH_CONFIG_ENV, raising=False)
    try:
        yield where
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _resolved(options: list[str], host: str) -> dict[str, str]:
    """ssh's own reading of the options for `host` (`ssh -G`: no connection)."""
    out = proc.run(["ssh", "-G", "-o", "BatchMode=yes", *options, host], timeout_s=30)
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def test_the_socket_lives_in_a_root_only_directory_with_a_short_path(control: Path) -> None:
    options = transfer._control_options("n2.a-very-long-host-name-of-a-cluster-node.example.org")
    assert control.is_dir() and (control.stat().st_mode & 0o777) == 0o700
    assert (control.parent.stat().st_mode & 0o777) == 0o755  # /run/vjob: saline.sock's users traverse it
    seen = _resolved(options, "n2.a-very-long-host-name-of-a-cluster-node.example.org")
    assert seen["controlmaster"] == "auto" and seen["controlpersist"] == str(transfer.CONTROL_PERSIST_S)
    socket = Path(seen["controlpath"])
    assert socket.parent == control and len(socket.name) == 40  # %C: a hash, whatever the host name
    assert len(str(socket)) + 17 <= transfer.SOCKET_PATH_MAX  # with ssh's temporary ".<16 chars>" suffix
    assert control.as_posix() in transfer._rsync_shell("n2").split(" ")[-3]  # rsync -e: one word per option


def test_a_directory_others_can_write_is_refused_not_repaired(control: Path, capfd: pytest.CaptureFixture[str]) -> None:
    control.mkdir(parents=True, mode=0o700)
    control.chmod(0o777)  # anyone could plant a socket where ssh looks for its master
    assert transfer._control_options("n2") == []  # a connection of its own, as without sharing
    assert (control.stat().st_mode & 0o777) == 0o777  # left for the operator, never trusted after a chmod
    logged = capfd.readouterr().err  # vjob.log writes JSON lines to stderr
    assert "control directory cannot be trusted" in logged and "writable by group or others" in logged
    assert "ControlPath" not in transfer._rsync_shell("n2")


def test_a_writable_parent_or_a_symlink_or_another_owner_is_refused(control: Path) -> None:
    control.parent.mkdir(parents=True, mode=0o755)
    control.parent.chmod(0o777)  # not sticky: someone could rename the directory away and put theirs
    assert transfer._control_options("n2") == []
    control.parent.chmod(0o755)
    elsewhere = control.parent / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    control.symlink_to(elsewhere)
    assert transfer._control_options("n2") == []
    control.unlink()
    control.mkdir(mode=0o700)
    os.chown(control, 65534, 65534)
    assert transfer._control_options("n2") == []
    os.chown(control, os.geteuid(), os.getegid())
    assert transfer._control_options("n2") != []  # the same directory, ours again: used


def test_a_path_too_long_for_a_socket_turns_sharing_off(control: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer, "CONTROL_DIR", control / ("x" * 60))
    assert transfer._control_options("n2") == []
    assert not (control / ("x" * 60)).exists()  # nothing created for a socket ssh could not bind


def test_sharing_off_gives_plain_connections(control: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer, "SHARE_CONNECTIONS", False)
    assert transfer._control_options("n2") == [] and not control.exists()
    assert transfer._rsync_shell("n2") == "ssh -o BatchMode=yes"


def test_closing_without_a_master_is_quiet_and_forgets_the_hosts(control: Path) -> None:
    transfer._control_options("n2.invalid")
    transfer._control_options("n3.invalid", None)
    assert {host for host, _ in transfer._shared} == {"n2.invalid", "n3.invalid"}
    assert transfer.close_connections(timeout_s=20) == 0  # real ssh -O stop: no master there
    assert transfer._shared == set()


def test_a_non_root_user_gets_a_directory_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert transfer.control_dir() == Path("/run/user/1000/vjob-ssh")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative")
    monkeypatch.setenv("HOME", "/home/u")
    assert transfer.control_dir() == Path("/home/u/.ssh/vjob-control")
