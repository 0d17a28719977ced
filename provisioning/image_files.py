"""An image's files on a node: what they must be, and putting them there whole.

Why a record of every file, not only the disk: a node's pilot opens four files of an image —
the index `<name>.image.json` (pilot.specs.check_image reads it), and through it the disk (the
backing file of every overlay), the kernel and the initrd libvirt boots. A node that shares no
directory with the controller must receive all four, and each must be judged by the bytes that
arrived. The disk's size and sha256 are the store's (`os_images`); the kernel's and initrd's,
and the command line, are recorded beside the catalogue's disk on the head when the image is
added (`<name>-<version>.files.json`, root's, 0644); the index is generated from that record
for the node's directory, so its bytes are known before it is written.

Installing on a node: every file that is not already there with the recorded size and sha256
is copied to a hidden temporary name, hashed on the node, renamed into place only when it
matches and removed when it does not. The index goes last: it is what makes the image exist
for a pilot, so a node whose copy is not whole never has an index naming that version (an
index found naming a version whose files are damaged is withdrawn first).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from provisioning import file_batch, safe_dirs, transfer
from provisioning.transfer import Endpoint
from vjob.errors import VjobError

INDEX_SUFFIX = ".image.json"
"""`<image_dir>/<name>.image.json`: the node's copy of an image, for pilots that have no store."""
RECORD_SUFFIX = ".files.json"
"""`<disk minus its format suffix>.files.json` beside the catalogue's disk on the head."""
MAX_RECORD_BYTES = 64 * 1024
BOOT_ROLES = ("kernel", "initrd")
INDEX = "index"
OK = "ok"
MISSING = "missing"


class Entry(Protocol):
    """What the catalogue knows of one image version (images.ImageInfo)."""

    name: str
    version: str
    format: str
    path: str
    size_bytes: int
    sha256: str


def boot_paths(image: Path) -> tuple[Path, Path]:
    """Where an image's kernel and initrd sit: beside it, same stem (they travel with it)."""
    return image.with_suffix(".vmlinuz"), image.with_suffix(".initrd")


def record_path(disk: Path) -> Path:
    return disk.with_suffix(RECORD_SUFFIX)


@dataclass(frozen=True)
class FileRecord:
    role: str
    """disk, kernel or initrd."""
    name: str
    """The file's name, the same in every node's image directory."""
    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class ImageFiles:
    """Every file of one image version a node needs, with its size and sha256."""

    name: str
    version: str
    format: str
    cmdline: str
    files: tuple[FileRecord, ...]
    """The disk first, then the kernel and initrd of a bootable image."""

    def file(self, role: str) -> FileRecord | None:
        return next((f for f in self.files if f.role == role), None)

    def index_text(self, directory: Path) -> str:
        """The index of this version in `directory`, byte for byte (sorted keys)."""
        disk = self.files[0]
        paths = {f.role: str(directory / f.name) for f in self.files}
        data = {
            "name": self.name,
            "version": self.version,
            "format": self.format,
            "path": paths["disk"],
            "sha256": disk.sha256,
            "size_bytes": disk.size_bytes,
            "kernel": paths.get("kernel", ""),
            "initrd": paths.get("initrd", ""),
            "cmdline": self.cmdline,
        }
        return json.dumps(data, indent=1, sort_keys=True)

    def index_name(self) -> str:
        return f"{self.name}{INDEX_SUFFIX}"


def _describe(path: Path) -> tuple[int, str]:
    return path.stat().st_size, transfer.sha256_file(path)


def make_record(entry: Entry, cmdline: str, *, check_disk: bool = True) -> ImageFiles:
    """The record of `entry` from the catalogue's files on the head: the disk as the store has
    it (its file must still match, hashed unless the caller just did), the kernel and initrd
    beside it when they exist."""
    disk = Path(entry.path)
    found = transfer.size_and_sha256(Endpoint(disk)) if check_disk else (entry.size_bytes, entry.sha256)
    if found != (entry.size_bytes, entry.sha256):
        raise VjobError(
            f"image {entry.name} {entry.version}: the catalogue's disk {disk} no longer matches its record "
            "(size or sha256): add the image again"
        )
    files = [FileRecord("disk", disk.name, entry.size_bytes, entry.sha256)]
    for role, path in zip(BOOT_ROLES, boot_paths(disk), strict=True):
        if path.is_file():
            files.append(FileRecord(role, path.name, *_describe(path)))
    return ImageFiles(entry.name, entry.version, entry.format, cmdline, tuple(files))


def write_record(disk: Path, record: ImageFiles) -> None:
    """Keep the record beside the catalogue's disk (0644, temporary name then rename)."""
    data = {
        "name": record.name,
        "version": record.version,
        "format": record.format,
        "cmdline": record.cmdline,
        "files": [vars(f) for f in record.files],
    }
    transfer.write_text(Endpoint(record_path(disk)), json.dumps(data, indent=1), mode=0o644)


def read_record(entry: Entry) -> ImageFiles | None:
    """The record beside the catalogue's disk; None when there is none (an image added before
    records were kept). A record that does not describe the store's disk is refused."""
    path = record_path(Path(entry.path))
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise VjobError(f"image {entry.name} {entry.version}: cannot read {path}: {exc.strerror}") from None
    try:
        if len(raw) > MAX_RECORD_BYTES:
            raise ValueError("too large")
        data = json.loads(raw)
        files = tuple(
            FileRecord(str(f["role"]), str(f["name"]), int(f["size_bytes"]), str(f["sha256"])) for f in data["files"]
        )
        record = ImageFiles(entry.name, entry.version, entry.format, str(data.get("cmdline", "")), files)
        roles = [f.role for f in files]
        if roles not in (["disk"], ["disk", *BOOT_ROLES]) or any(
            "/" in f.name or f.name[:1] in ("", ".") for f in files
        ):
            raise ValueError(f"files {roles}")
    except (ValueError, KeyError, TypeError) as exc:
        raise VjobError(f"image {entry.name} {entry.version}: {path} is damaged ({exc})") from None
    disk = files[0]
    if (disk.name, disk.size_bytes, disk.sha256) != (Path(entry.path).name, entry.size_bytes, entry.sha256):
        raise VjobError(f"image {entry.name} {entry.version}: {path} does not describe the catalogue's disk")
    return record


def previous_cmdline(directory: Path, name: str) -> str:
    """The command line the head's index gives image `name` (kept when a record is first made)."""
    try:
        return str(json.loads((directory / f"{name}{INDEX_SUFFIX}").read_text()).get("cmdline", ""))
    except (OSError, ValueError, AttributeError):
        return ""


@dataclass(frozen=True)
class Place:
    """An image directory on a node: `host` None is this machine."""

    node: str
    directory: Path
    host: str | None

    def at(self, name: str) -> Endpoint:
        return Endpoint(self.directory / name, self.host)


def index_version(place: Place, name: str) -> str | None:
    """The version the node's index of `name` names; None without one, "?" when unreadable."""
    try:
        text = transfer.read_text(place.at(f"{name}{INDEX_SUFFIX}"))
    except (OSError, VjobError):
        return "?"
    if text is None:
        return None
    try:
        return str(json.loads(text)["version"])
    except (ValueError, KeyError, TypeError):
        return "?"


def check(record: ImageFiles, place: Place, *, hashed: bool = True) -> dict[str, str]:
    """Per file (disk, kernel, initrd, index): OK, MISSING or what differs, as found on the node.

    `hashed`: size and sha256 computed on the node; otherwise sizes only for the large files
    (`vjob image list`: a stat per file), the small index always by its sha256. One ssh round
    trip for all of them on another host. An index naming another version reads "names version
    V": the node's pilots run that one."""
    text = record.index_text(place.directory).encode()
    wanted = [(f.name, f.size_bytes, f.sha256 if hashed else None) for f in record.files]
    wanted.append((record.index_name(), len(text), _sha(text)))
    found = _found(place, [(name, sha is not None) for name, _size, sha in wanted])
    states = [_state(got, size, sha) for got, (_name, size, sha) in zip(found, wanted, strict=True)]
    out = {f.role: state for f, state in zip(record.files, states, strict=False)}
    state = states[-1]
    if state not in (OK, MISSING):
        other = index_version(place, record.name)
        if other not in (None, "?", record.version):
            state = f"names version {other}"
    out[INDEX] = state
    return out


def _found(place: Place, files: list[tuple[str, bool]]) -> list[tuple[int, str] | None]:
    """Size and (when asked) sha256 of each file of `place`, None for a missing one: hashed on
    the node, in one ssh round trip for another host (`file_batch.found`)."""
    return file_batch.found(place.host, [(place.directory / name, hashed) for name, hashed in files])


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _state(found: tuple[int, str] | None, size: int, sha256: str | None) -> str:
    if found is None:
        return MISSING
    if found[0] != size:
        return f"{found[0]} bytes, {size} recorded"
    if sha256 is not None and found[1] != sha256:
        return f"sha256 {found[1][:12]}…, {sha256[:12]}… recorded"
    return OK


def _compare(where: Endpoint, size: int, sha256: str) -> str:
    return _state(transfer.size_and_sha256(where), size, sha256)


def whole(states: dict[str, str]) -> bool:
    return all(s == OK for s in states.values())


def install(record: ImageFiles, source: Place, target: Place, *, method: str, timeout_s: float) -> list[str]:
    """Put every file of `record` on `target`, copied from `source`; returns the roles copied
    (empty: the node held the whole image already). Raises VjobError naming the node and the
    file when a copy arrives different from the record (that copy is removed first)."""
    what = f"image {record.name} {record.version}: copy {source.node} -> {target.node}"
    states = check(record, target)
    if whole(states):
        return []
    index = target.at(record.index_name())
    if not states[INDEX].startswith("names version"):
        # The node's index names this version (or cannot be read) while a file is not whole:
        # withdrawn first, so that no pilot takes the image for whole while it is repaired.
        transfer.remove(index)
    if source.host is not None and target.host is not None and source.host != target.host and method == "rsync":
        method = "scp"  # rsync cannot copy between two other hosts; scp -3 relays through here
    copied: list[str] = []
    for f in record.files:
        if states[f.role] == OK:
            continue
        staged = target.at(f".{f.name}.incoming")
        transfer.copy(source.at(f.name), staged, method=method, mode=0o644, timeout_s=timeout_s)
        _accept(staged, target.at(f.name), f.size_bytes, f.sha256, f"{what}: {f.role} {f.name}")
        copied.append(f.role)
    text = record.index_text(target.directory)
    staged = target.at(f".{record.index_name()}.incoming")
    transfer.write_text(staged, text, mode=0o644)
    _accept(staged, index, len(text.encode()), _sha(text.encode()), f"{what}: index {record.index_name()}")
    copied.append(INDEX)
    return copied


def withdraw(record: ImageFiles, place: Place, *, timeout_s: float) -> None:
    """Remove this version's files from the node. The index goes first, and only when it names
    this version (or cannot be read): another version's index is what the node's pilots run,
    and an index is what makes an image exist for a pilot, so none ever names files half gone.
    The files, with any staged copy a cut transfer left, go in one more round trip."""
    if index_version(place, record.name) in (record.version, "?"):
        file_batch.remove_all(place.host, [place.at(record.index_name()).path], timeout_s=timeout_s)
    names = [name for f in record.files for name in (f.name, f".{f.name}.incoming")]
    file_batch.remove_all(place.host, [place.directory / name for name in names], timeout_s=timeout_s)


def _accept(staged: Endpoint, final: Endpoint, size: int, sha256: str, what: str) -> None:
    """Rename the staged copy into place when the bytes that arrived are the recorded ones;
    else remove it and say which file on which node differed."""
    state = _compare(staged, size, sha256)
    if state != OK:
        transfer.remove(staged)
        raise VjobError(f"{what} arrived {state}: removed, the node does not hold the image")
    transfer.rename(staged, final.path)  # made 0644 by the copy


def ensure_place(place: Place) -> None:
    """The node's image directory, created root's 0755 (QEMU reads base images) when absent."""
    if place.host is None:
        safe_dirs.ensure_dir(place.directory, 0o755)
        os.chmod(place.directory, 0o755)
    else:
        transfer.ensure_remote_dir(Endpoint(place.directory, place.host), 0o755)
