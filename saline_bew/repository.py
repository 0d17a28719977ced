"""A site's snapshot repository: where a vjob's latest safe snapshot lives between runs.

Why the checks: a snapshot is the only copy of the user's work once OAR has taken the nodes
back. It counts as safe only when every file of every VM is in the repository with the size
and sha256 it had on the node; a repository that is missing, read-only or too small is a
`RepositoryError` before or during the copy, and the previous safe snapshot stays the one the
vjob will resume from. Files are owner-only (0600 in 0700 directories): they hold memory.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from provisioning import transfer
from provisioning.transfer import Endpoint
from vjob.errors import VjobError

MARGIN = 1.05
"""Ask for 5 % more free space than the files need (filesystem metadata, other writers)."""


class RepositoryError(VjobError):
    """The repository cannot hold the snapshot: the vjob is not safe at this snapshot."""


class Repository:
    def __init__(self, site: str, path: str) -> None:
        if not path:
            raise RepositoryError(f"site {site}: no snapshot repository configured (saline.sites.repository)")
        if ":" in path.split("/", 1)[0]:
            raise RepositoryError(
                f"site {site}: repository {path!r}: remote repositories (host:path) are not supported yet"
            )
        self.site = site
        self.root = Path(path)

    def check(self, needed_bytes: int) -> None:
        """Refuse early when the repository is missing, unwritable or too small."""
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise RepositoryError(f"site {self.site}: repository {self.root}: cannot create: {exc.strerror}") from None
        if not self.root.is_dir():
            raise RepositoryError(f"site {self.site}: repository {self.root}: not a directory")
        probe = self.root / ".vjob-write-probe"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.close(fd)
            probe.unlink()
        except OSError as exc:
            raise RepositoryError(f"site {self.site}: repository {self.root}: not writable: {exc.strerror}") from None
        free = shutil.disk_usage(self.root).free
        if free < needed_bytes * MARGIN:
            raise RepositoryError(
                f"site {self.site}: repository {self.root}: {free} bytes free, {int(needed_bytes * MARGIN)} needed"
            )

    def label_dir(self, key: str, label: str) -> Path:
        return self.root / key / label

    def put(self, src: Path, key: str, label: str) -> Path:
        """Copy one file in (temporary name, then rename); an I/O error is a RepositoryError."""
        dest_dir = self.label_dir(key, label)
        try:
            dest_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(dest_dir.parent, 0o700)
            dest = dest_dir / src.name
            transfer.copy(Endpoint(src), Endpoint(dest), method="local")
        except OSError as exc:
            raise RepositoryError(
                f"site {self.site}: repository {self.root}: copy of {src.name} failed: {exc.strerror}"
            ) from None
        except VjobError as exc:
            raise RepositoryError(
                f"site {self.site}: repository {self.root}: copy of {src.name} failed: {exc}"
            ) from None
        return dest

    def verify(self, key: str, label: str, expected: dict[str, tuple[int, str]]) -> None:
        """Every file has the size and sha256 it had on the node."""
        for name, (size, digest) in expected.items():
            path = self.label_dir(key, label) / name
            try:
                actual = path.stat().st_size
            except OSError:
                raise RepositoryError(f"site {self.site}: {path} is missing after the copy") from None
            if actual != size or transfer.sha256_file(path) != digest:
                raise RepositoryError(
                    f"site {self.site}: {path} differs from the node's copy ({actual} vs {size} bytes)"
                )

    def remove_label(self, key: str, label: str) -> None:
        shutil.rmtree(self.label_dir(key, label), ignore_errors=True)

    def remove_job(self, key: str) -> None:
        shutil.rmtree(self.root / key, ignore_errors=True)

    def labels(self, key: str) -> list[str]:
        d = self.root / key
        return sorted(p.name for p in d.iterdir()) if d.is_dir() else []
