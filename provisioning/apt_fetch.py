"""Debian packages fetched with `apt-get download` and checked against apt's own record.

Why checked again: the guest's kernel and busybox go into every guest root builds. `apt-get
download` drops privileges to `_apt` and used to need a world-writable directory, where
anyone could swap a package. Here the download goes to a fresh private directory (as root,
apt is told to stay root: `APT::Sandbox::User=root`), and each .deb must have the size and
SHA256 that `apt-cache show` gives for that exact package and version, and carry that name
and version itself, before anything is unpacked from it.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from vjob import proc
from vjob.errors import VjobError

PACKAGE_RE = re.compile(r"[a-z0-9][a-z0-9+.-]{0,99}")
VERSION_RE = re.compile(r"[0-9A-Za-z.+~:-]{1,100}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")
MAX_DEB_BYTES = 512 << 20


@dataclass(frozen=True)
class AptRecord:
    """A package version as apt knows it from its signed index."""

    package: str
    version: str
    sha256: str
    size: int


def _run(cmd: list[str], cwd: Path | None = None, timeout_s: float = 300.0) -> str:
    return proc.run(cmd, timeout_s=timeout_s, cwd=cwd)


def check_package(name: str) -> str:
    if not isinstance(name, str) or not PACKAGE_RE.fullmatch(name):
        raise VjobError(f"package name {str(name)[:80]!r}: not a Debian package name")
    return name


def parse_record(text: str, package: str) -> AptRecord:
    """The first stanza of `apt-cache show` output for `package`."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        if line[0] in " \t" or ":" not in line:
            continue  # continuation lines of long fields (Description)
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    where = f"apt-cache show {package}"
    if fields.get("Package") != package:
        raise VjobError(f"{where}: no record for {package!r} (run apt-get update)")
    version, sha, size = fields.get("Version", ""), fields.get("SHA256", ""), fields.get("Size", "")
    if not VERSION_RE.fullmatch(version):
        raise VjobError(f"{where}: Version {version[:80]!r} is not a Debian version")
    if not SHA256_RE.fullmatch(sha):
        raise VjobError(f"{where}: SHA256 {sha[:80]!r} is not a sha256")
    if not size.isdigit() or not 0 < int(size) <= MAX_DEB_BYTES:
        raise VjobError(f"{where}: Size {size[:80]!r} is not a size up to {MAX_DEB_BYTES} bytes")
    return AptRecord(package, version, sha, int(size))


def candidate(package: str) -> AptRecord:
    """The version apt would install, with its SHA256 and size."""
    check_package(package)
    return parse_record(_run(["apt-cache", "show", "--no-all-versions", package]), package)


def available(packages: list[str]) -> set[str]:
    """The names among `packages` apt has a valid candidate record for, asked in one
    `apt-cache show` (each call loads apt's whole cache: 0.7 s of CPU here, so one per package
    made a cached image build spend 7 s, 25 s at load 14, before it looked at its cache)."""
    names = [name for name in packages if isinstance(name, str) and PACKAGE_RE.fullmatch(name)]
    if not names:
        return set()
    try:
        out = _run(["apt-cache", "show", "--no-all-versions", "--", *names])
    except VjobError:  # apt-cache exits 100 when it found none of them
        return set()
    found: set[str] = set()
    for stanza in out.split("\n\n"):
        name = next((line[8:].strip() for line in stanza.splitlines() if line.startswith("Package:")), "")
        if name in names:
            try:
                parse_record(stanza, name)
            except VjobError:
                continue
            found.add(name)
    return found


def _sha256(path: Path) -> tuple[str, int]:
    """sha256 and size of a regular file, opened without following a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    digest, size = hashlib.sha256(), 0
    with os.fdopen(fd, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
            size += len(block)
            if size > MAX_DEB_BYTES:
                break
    return digest.hexdigest(), size


def verify(deb: Path, record: AptRecord) -> None:
    """Raise unless `deb` is exactly the package apt recorded (size, SHA256, name, version)."""
    digest, size = _sha256(deb)
    want = f"{record.package} {record.version}"
    if size != record.size or digest != record.sha256:
        raise VjobError(
            f"{deb}: sha256 {digest[:16]}… ({size} bytes) is not apt's {record.sha256[:16]}… "
            f"({record.size} bytes) for {want}: refusing a package apt did not sign"
        )
    out = _run(["dpkg-deb", "--field", str(deb), "Package", "Version"])
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}
    got = f"{fields.get('Package', '')} {fields.get('Version', '')}"
    if got != want:
        raise VjobError(f"{deb}: holds {got[:120]!r}, expected {want}")


def download(records: list[AptRecord], into: Path) -> dict[str, Path]:
    """Download `records` into the private directory `into`; returns package → verified .deb.

    `into` must be a fresh directory only the caller can write (see safe_dirs).
    """
    argv = ["apt-get", "download", "-q"]
    if os.geteuid() == 0:
        argv += ["-o", "APT::Sandbox::User=root"]  # no drop to _apt: no directory _apt can write
    _run([*argv, *(f"{r.package}={r.version}" for r in records)], cwd=into, timeout_s=600)
    by_hash: dict[str, Path] = {}
    for deb in sorted(into.glob("*.deb")):
        by_hash[_sha256(deb)[0]] = deb
    out: dict[str, Path] = {}
    for rec in records:
        deb = by_hash.get(rec.sha256)
        if deb is None:
            raise VjobError(
                f"apt-get download {rec.package}={rec.version}: no file in {into} has apt's sha256 {rec.sha256[:16]}…"
            )
        verify(deb, rec)
        out[rec.package] = deb
    return out
