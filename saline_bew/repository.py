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
import re
import shutil
import stat
from pathlib import Path

from provisioning import integrity, transfer
from provisioning.transfer import Endpoint
from provisioning.vm_types import STATE_SUFFIX
from saline_bew import grammar
from vjob.errors import InputError, VjobError

MARGIN = 1.05
"""Ask for 5 % more free space than the files need (filesystem metadata, other writers)."""


class RepositoryError(VjobError):
    """The repository cannot hold the snapshot: the vjob is not safe at this snapshot."""


REMOTE = re.compile(r"(?P<host>[A-Za-z0-9][A-Za-z0-9._-]{0,252}):(?P<path>/[A-Za-z0-9_./-]{0,4000})")
"""`host:path`: an ssh host name (never an option: no leading '-') and an absolute plain path."""


def parse_location(site: str, spec: str) -> tuple[str | None, Path]:
    """(ssh host or None, root) of a configured repository; anything else is a RepositoryError.

    `fullmatch`: the host and the path reach ssh and rsync as arguments (never a shell string),
    and a host must not be taken for an option, a path must not climb out with `..`."""
    if not spec:
        raise RepositoryError(f"site {site}: no snapshot repository configured (saline.sites.repository)")
    if spec.startswith("/"):
        return None, Path(spec)
    m = REMOTE.fullmatch(spec)
    if m is None or ".." in m["path"].split("/"):
        raise RepositoryError(
            f"site {site}: repository {grammar.short(spec)}: must be an absolute path or HOST:/ABSOLUTE/PATH "
            "(host: letters, digits, . _ -, not starting with -; path: letters, digits, _ . / -, no '..')"
        )
    return m["host"], Path(m["path"])


class Repository:
    """A site's repository: a directory of the master's machine, or `host:path` on another
    host reached by rsync over ssh (`VJOB_SSH_CONFIG` names the ssh options), where every
    check (free space, sizes, sha256) runs on the repository's host itself."""

    def __init__(self, site: str, path: str) -> None:
        self.site = site
        self.host, self.root = parse_location(site, path)
        self._made: set[tuple[str, str]] = set()
        """Remote label directories made by this process (one ssh round trip saved per file)."""

    @property
    def where(self) -> str:
        return Endpoint(self.root, self.host).spec()

    def endpoint(self, key: str, label: str, name: str) -> Endpoint:
        """One file of a snapshot where it lives (this machine or the repository's host)."""
        return Endpoint(self.label_dir(key, label) / name, self.host)

    def check(self, needed_bytes: int) -> None:
        """Refuse early when the repository is missing, unwritable or too small."""
        if self.host is not None:
            self._check_remote(needed_bytes)
            return
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

    def _check_remote(self, needed_bytes: int) -> None:
        """The root on the repository's host is ours and writable by nobody else (so nothing
        under it can be planted by another user), and has room. Every check is one ssh round
        trip: on a loaded master each costs about a second."""
        host = self.host
        assert host is not None
        try:
            transfer.ensure_remote_dir(Endpoint(self.root, host), 0o700)
            out = transfer.run_on(host, ["df", "-B1", "--output=avail", "--", str(self.root)]).split()
        except VjobError as exc:
            raise RepositoryError(f"site {self.site}: repository {self.where}: not usable: {exc}") from None
        if len(out) != 2 or not out[1].isdigit():
            raise RepositoryError(f"site {self.site}: repository {self.where}: df answered {' '.join(out)[:80]!r}")
        if int(out[1]) < needed_bytes * MARGIN:
            raise RepositoryError(
                f"site {self.site}: repository {self.where}: {out[1]} bytes free, {int(needed_bytes * MARGIN)} needed"
            )

    def _remote_dirs(self, key: str, label: str) -> None:
        """The key's and label's directories (0700) under the checked root, made once per label:
        the root is ours and 0700, so nobody else can have put anything there."""
        assert self.host is not None
        if (key, label) in self._made:
            return
        key_dir = self.root / key
        transfer.run_on(self.host, ["mkdir", "-p", "-m", "700", "--", str(key_dir), str(key_dir / label)])
        self._made.add((key, label))

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
        """Where a snapshot lives; the key and label are checked (RepositoryError otherwise).
        On a remote repository the path is on its host."""
        key, label = self._key(key), self._label(label)
        if self.host is None:
            self._under_root(key, label)
        return self.root / key / label

    def put(self, src: Endpoint, key: str, label: str) -> Path:
        """Copy one file in (temporary name, then rename) from a node's snapshot dir, this
        machine's or another host's; an I/O error is a RepositoryError."""
        dest_dir = self.label_dir(key, label)
        name = src.path.name
        if self.host is not None:
            try:
                self._remote_dirs(key, label)
                transfer.copy(src, Endpoint(dest_dir / name, self.host), method="rsync")
            except VjobError as exc:
                raise RepositoryError(
                    f"site {self.site}: repository {self.where}: copy of {name} failed: {exc}"
                ) from None
            return dest_dir / name
        try:
            dest_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            if self._under_root(key, label) is None:
                raise RepositoryError(f"site {self.site}: {dest_dir}: vanished while being created")
            os.chmod(dest_dir.parent, 0o700, follow_symlinks=False)
            dest = dest_dir / name
            transfer.copy(src, Endpoint(dest), method="local" if src.host is None else "rsync")
        except OSError as exc:
            raise RepositoryError(
                f"site {self.site}: repository {self.root}: copy of {name} failed: {exc.strerror}"
            ) from None
        except VjobError as exc:
            raise RepositoryError(f"site {self.site}: repository {self.root}: copy of {name} failed: {exc}") from None
        return dest

    def verify(self, key: str, label: str, expected: dict[str, tuple[int, str]]) -> None:
        """Every file has the size and sha256 it had on the node; on a remote repository both
        are computed on its host (the bytes that arrived), and every memory state is also
        checked against its manifest there, as the VM driver checks a copy before a restore."""
        if self.host is not None:
            self._verify_remote(key, label, expected)
            return
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

    def _verify_remote(self, key: str, label: str, expected: dict[str, tuple[int, str]]) -> None:
        """Sizes and sha256 computed on the repository's host in two round trips for all files,
        then each memory state's manifest (read there) must name the same size and sha256."""
        assert self.host is not None
        names = sorted(expected)
        paths = [str(self.label_dir(key, label) / n) for n in names]
        try:
            sizes = _pairs(transfer.run_on(self.host, ["stat", "-L", "-c", "%s %n", "--", *paths]))
            sums = _pairs(transfer.run_on(self.host, ["sha256sum", "--", *paths]))
        except VjobError as exc:
            raise RepositoryError(
                f"site {self.site}: {self.where}/{key}/{label}: not intact after the copy: {exc}"
            ) from None
        for name, path in zip(names, paths, strict=True):
            size, digest = expected[name]
            where = f"{self.host}:{path}"
            if path not in sizes:
                raise RepositoryError(f"site {self.site}: {where} is missing after the copy")
            if sizes[path] != str(size) or sums.get(path) != digest:
                raise RepositoryError(
                    f"site {self.site}: {where} differs from the node's copy ({sizes[path]} vs {size} bytes)"
                )
            if name.endswith(STATE_SUFFIX):
                manifest = integrity.read_manifest(Path(path), self.host)
                if (
                    not isinstance(manifest, dict)
                    or str(manifest.get("sha256")) != digest
                    or str(manifest.get("size_bytes")) != str(size)
                ):
                    raise RepositoryError(f"site {self.site}: {where}: its manifest there does not describe it")

    def _remove_remote(self, *parts: str) -> None:
        assert self.host is not None
        self._made = {m for m in self._made if m[: len(parts)] != parts}
        try:
            transfer.run_on(self.host, ["rm", "-rf", "--", str(self.root.joinpath(*parts))])
        except VjobError as exc:
            raise RepositoryError(
                f"site {self.site}: repository {self.where}: cannot remove {'/'.join(parts)}: {exc}"
            ) from None

    def remove_label(self, key: str, label: str) -> None:
        if self.host is not None:
            self._remove_remote(self._key(key), self._label(label))
            return
        found = self._under_root(self._key(key), self._label(label))
        if found is not None:
            _rmtree(found)

    def remove_job(self, key: str) -> None:
        if self.host is not None:
            self._remove_remote(self._key(key))
            return
        found = self._under_root(self._key(key))
        if found is not None:
            _rmtree(found)

    def labels(self, key: str) -> list[str]:
        if self.host is not None:
            where = Endpoint(self.root / self._key(key), self.host)
            if not transfer.exists(where):
                return []
            names = transfer.run_on(self.host, ["ls", "-1A", "--", str(where.path)]).split("\n")
            return sorted(n for n in names if grammar.LABEL.fullmatch(n))
        d = self._under_root(self._key(key))
        return sorted(p.name for p in d.iterdir()) if d is not None else []


def _rmtree(path: Path) -> None:
    """Delete a checked directory. shutil.rmtree works through directory descriptors on Linux
    and never follows a symlink inside the tree (it unlinks the link itself)."""
    shutil.rmtree(path, ignore_errors=True)


def _pairs(text: str) -> dict[str, str]:
    """`VALUE PATH` lines (stat -c '%s %n', sha256sum) as {path: value}; paths have no spaces
    (keys, labels and VM names follow their grammars)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        value, _, path = line.partition(" ")
        out[path.lstrip(" *")] = value  # sha256sum: two spaces, or " *" in binary mode
    return out
