"""A site's snapshot repository: where a vjob's latest safe snapshot lives between runs.

Why the checks: a snapshot is the only copy of the user's work once OAR has taken the nodes
back. It counts as safe only when every file of every VM is in the repository with the size
and sha256 it had on the node; a repository that is missing, read-only or too small is a
`RepositoryError` before or during the copy, and the previous safe snapshot stays the one the
vjob will resume from. Files are owner-only (0600 in 0700 directories): they hold memory.

Why every key and label is checked here too: they come back from the shared store, and the
manager runs as root. A key `../victim` once made it delete a directory outside the
repository. So a key or label must match its grammar (saline_bew.grammar), every directory on
the way is checked with `os.lstat` to be a real directory (never a symlink), and the resolved
path must stay under the repository root; anything else is a RepositoryError and nothing is
touched.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from provisioning import transfer
from provisioning.transfer import Endpoint
from saline_bew import grammar
from vjob.errors import InputError, VjobError

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

    def _under_root(self, *parts: str) -> Path | None:
        """root/parts… when every step is a real directory inside the root; None when the
        last one does not exist yet. A symlink, a non-directory or a path escaping the root
        is a RepositoryError: the caller touches nothing."""
        path = self.root
        for part in parts:
            path = path / part
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise RepositoryError(f"site {self.site}: {path}: {exc.strerror}") from None
            if not stat.S_ISDIR(st.st_mode):
                raise RepositoryError(f"site {self.site}: {path}: not a plain directory (a symlink?): refused")
        real_root = os.path.realpath(self.root)
        if os.path.commonpath([real_root, os.path.realpath(path)]) != real_root:
            raise RepositoryError(f"site {self.site}: {path}: outside the repository {self.root}: refused")
        return path

    def _key(self, key: str) -> str:
        try:
            return grammar.word("key", key, grammar.KEY)
        except InputError as exc:
            raise RepositoryError(f"site {self.site}: repository {self.root}: {exc}: refused") from None

    def _label(self, label: str) -> str:
        try:
            return grammar.word("snapshot label", label, grammar.LABEL)
        except InputError as exc:
            raise RepositoryError(f"site {self.site}: repository {self.root}: {exc}: refused") from None

    def label_dir(self, key: str, label: str) -> Path:
        """Where a snapshot lives; the key and label are checked (RepositoryError otherwise)."""
        key, label = self._key(key), self._label(label)
        self._under_root(key, label)
        return self.root / key / label

    def put(self, src: Path, key: str, label: str) -> Path:
        """Copy one file in (temporary name, then rename); an I/O error is a RepositoryError."""
        dest_dir = self.label_dir(key, label)
        try:
            dest_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            if self._under_root(key, label) is None:
                raise RepositoryError(f"site {self.site}: {dest_dir}: vanished while being created")
            os.chmod(dest_dir.parent, 0o700, follow_symlinks=False)
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
        found = self._under_root(self._key(key), self._label(label))
        if found is not None:
            _rmtree(found)

    def remove_job(self, key: str) -> None:
        found = self._under_root(self._key(key))
        if found is not None:
            _rmtree(found)

    def labels(self, key: str) -> list[str]:
        d = self._under_root(self._key(key))
        return sorted(p.name for p in d.iterdir()) if d is not None else []


def _rmtree(path: Path) -> None:
    """Delete a checked directory. shutil.rmtree works through directory descriptors on Linux
    and never follows a symlink inside the tree (it unlinks the link itself)."""
    shutil.rmtree(path, ignore_errors=True)
