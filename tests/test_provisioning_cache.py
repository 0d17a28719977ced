"""The guest build cache is root's alone: checked before use, packages checked against apt.

The attack (issue 23 item 1): the cache root builds every initrd from was world-writable, so
any user could swap busybox or the kernel and put their own /init into every guest. These
tests plant what such a user would and expect a refusal naming the path; then they check the
modes a build leaves (with build inputs made here, so no download is needed), and that an
initrd embedding a job's payload is the QEMU user's only.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pwd
import stat
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioning import apt_fetch, guest, safe_dirs
from provisioning.safe_dirs import UnsafePathError
from vjob.errors import VjobError

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown to another user)")


def _fake_parts(root: Path) -> None:
    """Build inputs as a finished fetch leaves them (dummy binaries: nothing boots here)."""
    parts = root / guest.PARTS
    (parts / "mods").mkdir(parents=True)
    for d in (root, parts, parts / "mods"):
        d.chmod(0o755)
    (parts / "vmlinuz").write_bytes(b"kernel")
    (parts / "busybox").write_bytes(b"busybox")
    for module in guest.VIRTIO_MODULES:
        (parts / "mods" / f"{module.rsplit('/', 1)[-1]}.ko").write_bytes(module.encode())
    (parts / "manifest.json").write_text(json.dumps({"busybox-static": {"version": "1", "sha256": "0" * 64}}))
    for path in parts.rglob("*"):
        if path.is_file():
            path.chmod(0o644)


# -- the cache directory ---------------------------------------------------------------------
def test_a_world_writable_cache_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "guest"
    root.mkdir()
    root.chmod(0o777)
    with pytest.raises(UnsafePathError, match=rf"{root}: is writable by group or others \(mode 0777\).*rm -rf"):
        guest.build(root=root)
    assert stat.S_IMODE(root.stat().st_mode) == 0o777  # refused, not silently "repaired"


def test_a_world_writable_parent_is_refused_a_sticky_one_is_not(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafePathError, match=rf"{shared}: is writable by group or others .* not sticky"):
        guest.build(root=shared / "guest")
    shared.chmod(0o1777)  # like /tmp: others cannot rename what we own in it
    made = safe_dirs.ensure_dir(shared / "guest")
    assert stat.S_IMODE(made.stat().st_mode) == 0o755


def test_a_symlinked_cache_or_parent_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UnsafePathError, match=rf"{tmp_path / 'link'}: is a symlink"):
        guest.build(root=tmp_path / "link")
    with pytest.raises(UnsafePathError, match=rf"{tmp_path / 'link'}: is a symlink above"):
        guest.build(root=tmp_path / "link" / "guest")


@ROOT_ONLY
def test_a_cache_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody").pw_uid
    root = tmp_path / "guest"
    root.mkdir()
    os.chown(root, nobody, -1)
    with pytest.raises(UnsafePathError, match=rf"{root}: is owned by uid {nobody}"):
        guest.build(root=root)
    os.chown(root, 0, -1)
    _fake_parts(root)
    os.chown(root / guest.PARTS / "busybox", nobody, -1)  # a swapped build input
    with pytest.raises(UnsafePathError, match=rf"{root / guest.PARTS / 'busybox'}: is owned by uid {nobody}"):
        guest.build(root=root)


def test_the_old_world_writable_download_dir_is_dropped_and_a_loose_one_refused(tmp_path: Path) -> None:
    """The old code's debs/ (0777, maybe holding a swapped busybox) is never built from: it is
    removed; any other directory in the cache that others could write is refused."""
    root = tmp_path / "guest"
    (root / "debs" / "bb" / "bin").mkdir(parents=True)
    root.chmod(0o755)
    (root / "debs").chmod(0o777)
    (root / "debs" / "bb" / "bin" / "busybox").write_bytes(b"#!/bin/sh\necho owned\n")
    (root / "debs" / "escape").symlink_to(tmp_path / "outside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep").write_text("kept")
    _fake_parts(root)
    files = guest.build(root=root)
    assert not (root / "debs").exists() and (tmp_path / "outside" / "keep").read_text() == "kept"
    assert b"owned" not in gzip.decompress(files.initrd.read_bytes())
    (root / guest.PARTS).chmod(0o777)
    with pytest.raises(UnsafePathError, match=rf"{root / guest.PARTS}: is writable by group or others \(mode 0777\)"):
        guest.build(root=root)


# -- packages checked against apt --------------------------------------------------------------
def _deb(tmp_path: Path, package: str, version: str) -> Path:
    src = tmp_path / f"src-{package}"
    (src / "DEBIAN").mkdir(parents=True)
    (src / "bin").mkdir()
    (src / "bin" / "busybox").write_text("#!/bin/sh\necho 'my own /init'\n")
    control = f"Package: {package}\nVersion: {version}\nArchitecture: amd64\nMaintainer: x <x@x>\nDescription: x\n"
    (src / "DEBIAN" / "control").write_text(control)
    out = tmp_path / f"{package}.deb"
    subprocess.run(["dpkg-deb", "--build", "-Zgzip", str(src), str(out)], check=True, capture_output=True, timeout=60)
    return out


def test_a_planted_deb_whose_hash_is_not_apts_is_refused(tmp_path: Path) -> None:
    # The guest build itself needs apt's record of busybox (deploy/bootstrap ran apt-get
    # update): without it this is a failure of the set-up, never a skip.
    record = apt_fetch.candidate(guest.BUSYBOX_PACKAGE)
    planted = _deb(tmp_path, record.package, record.version)  # right name and version, own content
    with pytest.raises(VjobError, match=rf"{planted}: sha256 .* is not apt's {record.sha256[:16]}"):
        apt_fetch.verify(planted, record)


def test_the_packages_apt_knows_are_found_in_one_lookup() -> None:
    """An image build's package check: one `apt-cache show` for all names (a virtual package,
    an unknown one and a malformed name are not found; none found at all is an empty set)."""
    wanted = [guest.BUSYBOX_PACKAGE, "python3", "no-such-package-vjob", "mail-transport-agent", "Bad name"]
    assert apt_fetch.available(wanted) == {guest.BUSYBOX_PACKAGE, "python3"}
    assert apt_fetch.available(["no-such-package-vjob"]) == set() == apt_fetch.available([])


def test_a_deb_must_carry_the_recorded_name_and_version(tmp_path: Path) -> None:
    deb = _deb(tmp_path, "evil", "9.9")
    digest = hashlib.sha256(deb.read_bytes()).hexdigest()
    as_busybox = apt_fetch.AptRecord("busybox-static", "9.9", digest, deb.stat().st_size)
    with pytest.raises(VjobError, match=r"holds 'evil 9.9', expected busybox-static 9.9"):
        apt_fetch.verify(deb, as_busybox)
    apt_fetch.verify(deb, apt_fetch.AptRecord("evil", "9.9", digest, deb.stat().st_size))  # the genuine one passes


def test_apt_records_are_parsed_strictly() -> None:
    good = "Package: busybox-static\nVersion: 1:1.35.0-4\nSize: 10\nSHA256: " + "a" * 64 + "\nDescription: x\n y\n"
    assert apt_fetch.parse_record(good, "busybox-static") == apt_fetch.AptRecord(
        "busybox-static", "1:1.35.0-4", "a" * 64, 10
    )
    with pytest.raises(VjobError, match="SHA256 'zz' is not a sha256"):
        apt_fetch.parse_record(good.replace("a" * 64, "zz"), "busybox-static")
    with pytest.raises(VjobError, match="no record for 'other'"):
        apt_fetch.parse_record(good, "other")
    with pytest.raises(VjobError, match="no record for 'busybox-static'"):
        apt_fetch.parse_record("", "busybox-static")
    with pytest.raises(VjobError, match="package name"):
        apt_fetch.check_package("busybox\n")


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_apt_record_parser_fuzz(text: str) -> None:
    try:
        rec = apt_fetch.parse_record(text, "p")
    except VjobError:
        return
    assert apt_fetch.SHA256_RE.fullmatch(rec.sha256) and apt_fetch.VERSION_RE.fullmatch(rec.version)


# -- what a build leaves -----------------------------------------------------------------------
def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (stat.S_IMODE(p.lstat().st_mode), p.lstat().st_uid) for p in [root, *root.rglob("*")]
    }


def test_a_build_leaves_owner_only_writable_files_and_a_private_payload(tmp_path: Path) -> None:
    root = tmp_path / "guest"
    _fake_parts(root)
    counter = guest.build(root=root)
    payload = guest.build(payload="echo secret\n", root=root)
    tree = _tree(root)
    euid = os.geteuid()
    qemu_uid = pwd.getpwnam(guest.DEFAULT_QEMU_USER).pw_uid if euid == 0 else euid
    assert tree["."] == (0o755, euid)
    assert tree[str(counter.kernel.relative_to(root))] == (0o644, euid)
    assert tree[str(counter.initrd.relative_to(root))] == (0o644, euid)
    assert tree[guest.PAYLOAD_DIR] == (0o711, euid)  # QEMU reaches it by name, nobody lists it
    assert tree[str(payload.initrd.relative_to(root))] == (0o600, qemu_uid)
    assert payload.initrd.parent == root / guest.PAYLOAD_DIR
    assert all(mode & 0o022 == 0 for mode, _ in tree.values()), tree
    assert b"echo secret" in gzip.decompress(payload.initrd.read_bytes())


def test_a_changed_or_loosened_guest_file_is_rebuilt(tmp_path: Path) -> None:
    """kernel and initrds are compared with what they must hold at every build (libvirt hands
    them to the QEMU user while a VM runs, so their owner alone proves nothing)."""
    root = tmp_path / "guest"
    _fake_parts(root)
    files = guest.build(root=root)
    payload = guest.build(payload="echo secret\n", root=root)
    good = files.initrd.read_bytes()
    files.initrd.write_bytes(b"tampered")
    payload.initrd.chmod(0o644)  # as the old code left payload initrds
    assert guest.build(root=root) == files and files.initrd.read_bytes() == good
    assert guest.build(payload="echo secret\n", root=root) == payload
    assert stat.S_IMODE(payload.initrd.stat().st_mode) == 0o600


def test_only_the_builds_own_leftovers_are_cleaned(tmp_path: Path) -> None:
    root = tmp_path / "guest"
    _fake_parts(root)
    (root / ".initrd-abc.gz-x1").write_bytes(b"half")  # a build killed midway
    (root / ".fetch-x2").mkdir()
    (root / ".base-64M.qcow2.123").write_bytes(b"")  # another writer's temporary file (vjob run)
    guest.build(root=root)
    assert sorted(p.name for p in root.glob(".*")) == [".base-64M.qcow2.123", ".lock"]
