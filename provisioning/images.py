"""The OS image catalogue: which images exist, their checksums, which nodes hold them and the
one each node runs (the image it last ran or received: its OS, UBIS's VM_os).

Why in the store: UBIS's priority needs N_availableOS (the nodes already holding a job's
OS, a node's VM_os attribute) and the distribution tree needs who received each image from
whom; both must survive restarts and be shared by every agent. The image files themselves
live in `image_dir` on each node (the head node's copy is the catalogue's).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sqlalchemy import select

from provisioning import distribution, image_pipeline, safe_dirs, transfer
from provisioning.transfer import Endpoint
from provisioning.vm_types import check_name
from vjob import log
from vjob.config import ProvisioningConfig
from vjob.errors import CommandError, InputError, VjobError
from vjob.model import Node
from vjob.store.db import Store, now, open_store
from vjob.store.schema import ImageRecord, NodeImageRecord, VMRecord

INDEX_SUFFIX = ".image.json"
"""`<image_dir>/<name>.image.json`: the node's copy of an image, for pilots that have no store."""
MAX_INDEX_BYTES = 64 * 1024
_log = log.get("provisioning")
VERSION_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True)
class ImageInfo:
    name: str
    version: str
    format: str
    path: str
    size_bytes: int
    sha256: str
    created_at: float
    holders: dict[str, str | None] = field(default_factory=dict)
    """node -> the node it received the image from (None for the head)."""


@dataclass(frozen=True)
class LocalImage:
    """An image as a node holds it: the disk and, for a real guest, its kernel and initrd."""

    name: str
    version: str
    format: str
    path: Path
    sha256: str
    kernel: Path | None
    initrd: Path | None
    cmdline: str


def boot_paths(image: Path) -> tuple[Path, Path]:
    """Where an image's kernel and initrd sit: beside it, same stem (they travel with it)."""
    return image.with_suffix(".vmlinuz"), image.with_suffix(".initrd")


def node_image_dir(config: ProvisioningConfig, data_dir: Path, node: str) -> Path:
    raw = config.image_dir or str(Path(data_dir) / "images")
    return Path(raw.replace("{node}", check_name("node", node)))


def local_image(config: ProvisioningConfig, data_dir: Path, node: str, name: str) -> LocalImage | None:
    """The image `name` as this node holds it (its index file), None when it holds none.

    The index is root's (image_dir is checked by safe_dirs when written); it is still read as
    data: a bounded JSON object whose files must lie in the image directory.
    """
    check_name("image", name)
    directory = node_image_dir(config, data_dir, node)
    index = directory / f"{name}{INDEX_SUFFIX}"
    try:
        raw = index.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"image {name}: cannot read {index}: {exc.strerror}") from None
    try:
        if len(raw) > MAX_INDEX_BYTES:
            raise ValueError("too large")
        data = json.loads(raw)
        path = Path(data["path"])
        kernel = Path(data["kernel"]) if data.get("kernel") else None
        initrd = Path(data["initrd"]) if data.get("initrd") else None
        for p in (path, kernel, initrd):
            if p is not None and (p.parent != directory or not p.is_file()):
                raise ValueError(f"{p} is not a file in {directory}")
        return LocalImage(
            name,
            str(data["version"]),
            str(data["format"]),
            path,
            str(data["sha256"]),
            kernel,
            initrd,
            str(data.get("cmdline", "")),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"image {name}: {index} is damaged ({exc}): run `vjob image distribute` again") from None


def write_index(directory: Path, info: ImageInfo, *, cmdline: str = "") -> None:
    """Write `<name>.image.json` in a node's image directory (ours, 0644), atomically."""
    path = Path(info.path)
    image = directory / path.name
    kernel, initrd = boot_paths(image)
    data = {
        "name": info.name,
        "version": info.version,
        "format": info.format,
        "path": str(image),
        "sha256": info.sha256,
        "size_bytes": info.size_bytes,
        "kernel": str(kernel) if kernel.exists() else "",
        "initrd": str(initrd) if initrd.exists() else "",
        "cmdline": cmdline or _read_cmdline(directory, info.name),
    }
    tmp = directory / f".{info.name}{INDEX_SUFFIX}.{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.chmod(tmp, 0o644)
    os.replace(tmp, directory / f"{info.name}{INDEX_SUFFIX}")


def _read_cmdline(directory: Path, name: str) -> str:
    try:
        return str(json.loads((directory / f"{name}{INDEX_SUFFIX}").read_text()).get("cmdline", ""))
    except (OSError, ValueError, AttributeError):
        return ""


class Catalogue:
    """The catalogue on one store, with the nodes' image directories from configuration."""

    def __init__(self, store: Store, config: ProvisioningConfig, *, data_dir: Path) -> None:
        self.store = store
        self.config = config
        self.data_dir = Path(data_dir)

    @property
    def head(self) -> str:
        return self.config.head_node

    def image_dir(self, node: str) -> Path:
        raw = self.config.image_dir or str(self.data_dir / "images")
        return Path(raw.replace("{node}", check_name("node", node)))

    def image_path(self, node: str, name: str, version: str, fmt: str) -> Path:
        return self.image_dir(node) / f"{name}-{version}.{fmt}"

    # -- add / list / remove ---------------------------------------------------------------
    def add_or_reuse(self, name: str, file: Path, *, kernel: Path, initrd: Path, cmdline: str) -> ImageInfo:
        """Add a bootable image (disk + kernel + initrd), or keep the one the catalogue already
        has with the same content; the head's index file then points at it."""
        digest = transfer.sha256_file(file)
        try:
            info = self.get(name)
        except InputError:
            info = None
        if info is None or info.sha256 != digest or not Path(info.path).is_file():
            info = self.add(name, file, version=time.strftime("%Y%m%d.%H%M%S"))
        target = Path(info.path)
        for src, dst in zip((kernel, initrd), boot_paths(target), strict=True):
            transfer.copy(Endpoint(src), Endpoint(dst), method="local", mode=0o644)
        write_index(target.parent, info, cmdline=cmdline)
        return info

    def add(self, name: str, file: Path, *, version: str = "1") -> ImageInfo:
        """Copy `file` into the head node's image directory and record it with its sha256."""
        check_name("image", name)
        if not version or set(version) - VERSION_CHARS:
            raise InputError(f"image {name}: version {version!r}: letters, digits, '.', '_' and '-' only")
        if not file.is_file():
            raise InputError(f"image {name}: --file {file}: no such file")
        fmt = detect_format(file)
        with self.store.session() as s:
            if s.scalar(select(ImageRecord).where(ImageRecord.name == name, ImageRecord.version == version)):
                raise InputError(f"image {name} version {version} is already in the catalogue (remove it first)")
        target = self.image_path(self.head, name, version, fmt)
        safe_dirs.ensure_dir(target.parent, 0o755)  # root's only: every VM's disk is built on these
        target.parent.chmod(0o755)  # QEMU (libvirt-qemu) reads base images
        transfer.copy(Endpoint(file), Endpoint(target), method="local", mode=0o644)
        digest = transfer.sha256_file(target)
        t = now()
        with self.store.session() as s:
            rec = ImageRecord(
                name=name,
                version=version,
                format=fmt,
                path=str(target),
                size_bytes=target.stat().st_size,
                sha256=digest,
                created_at=t,
            )
            s.add(rec)
            s.flush()
            s.add(NodeImageRecord(node=self.head, image_id=rec.id, received_from=None, received_at=t))
        return self.get(name, version)

    def get(self, name: str, version: str | None = None) -> ImageInfo:
        """The image `name` (its newest version unless `version` is given)."""
        with self.store.session() as s:
            query = select(ImageRecord).where(ImageRecord.name == name)
            if version is not None:
                query = query.where(ImageRecord.version == version)
            recs = list(s.scalars(query.order_by(ImageRecord.created_at.desc(), ImageRecord.id.desc())))
            if not recs:
                shown = f"{name} version {version}" if version else name
                raise InputError(f"image {shown}: not in the catalogue (see 'vjob image list')")
            return self._info(s, recs[0])

    def list(self) -> list[ImageInfo]:
        with self.store.session() as s:
            recs = s.scalars(select(ImageRecord).order_by(ImageRecord.name, ImageRecord.version))
            return [self._info(s, r) for r in recs]

    @staticmethod
    def _info(s: object, rec: ImageRecord) -> ImageInfo:
        rows = s.scalars(select(NodeImageRecord).where(NodeImageRecord.image_id == rec.id))  # type: ignore[attr-defined]
        holders = {r.node: r.received_from for r in rows}
        return ImageInfo(
            rec.name,
            rec.version,
            rec.format,
            rec.path,
            rec.size_bytes,
            rec.sha256,
            rec.created_at,
            dict(sorted(holders.items())),
        )

    def remove(self, name: str, *, version: str | None = None) -> list[ImageInfo]:
        """Forget the image (all versions unless `version`) and delete the head's file.

        Refused while a VM recorded in the store is built on it: its overlay needs it.
        """
        with self.store.session() as s:
            query = select(ImageRecord).where(ImageRecord.name == name)
            if version is not None:
                query = query.where(ImageRecord.version == version)
            recs = list(s.scalars(query))
            if not recs:
                raise InputError(f"image {name}{f' version {version}' if version else ''}: not in the catalogue")
            paths = {r.path for r in recs} | {name}
            users = list(s.scalars(select(VMRecord.name).where(VMRecord.image.in_(paths))))
            if users:
                raise VjobError(f"image {name} is used by VM(s) {', '.join(sorted(users))}: delete them first")
            removed = [self._info(s, r) for r in recs]
            for r in recs:
                s.delete(r)
        for info in removed:
            Path(info.path).unlink(missing_ok=True)
            for extra in boot_paths(Path(info.path)):
                extra.unlink(missing_ok=True)
            index = Path(info.path).parent / f"{info.name}{INDEX_SUFFIX}"
            if _index_version(index) == info.version:
                index.unlink(missing_ok=True)
        return removed

    def verify(self, name: str | None = None) -> list[str]:
        """Recompute every checksum reachable from here; returns the problems (empty: all good)."""
        problems = []
        images = [self.get(name)] if name else self.list()
        for info in images:
            for node in info.holders:
                path = (
                    Path(info.path)
                    if node == self.head
                    else self.image_path(node, info.name, info.version, info.format)
                )
                if self.config.copy_method != "local" and node != self.head:
                    continue  # remote copies are checked on their node
                if not path.exists():
                    problems.append(f"image {info.name} {info.version} on node {node}: {path} is missing")
                elif path.stat().st_size != info.size_bytes:
                    problems.append(
                        f"image {info.name} {info.version} on node {node}: {path} is "
                        f"{path.stat().st_size} bytes, {info.size_bytes} recorded"
                    )
                elif transfer.sha256_file(path) != info.sha256:
                    problems.append(f"image {info.name} {info.version} on node {node}: {path} sha256 differs")
        return problems

    # -- distribution ----------------------------------------------------------------------
    def tree(self, extra: Iterable[str] = ()) -> distribution.Tree:
        nodes = set(self.config.nodes) | set(extra)
        for node in nodes:
            check_name("node", node)
        return distribution.Tree.build(self.head, nodes)

    def plan(self, name: str, targets: Iterable[str], *, version: str | None = None) -> distribution.Plan:
        info = self.get(name, version)
        wanted = list(targets)
        if not wanted:
            raise InputError("image distribute: --nodes: give at least one node")
        tree = self.tree([*wanted, *info.holders])
        return distribution.plan(f"{info.name}-{info.version}", tree, info.holders, wanted)

    def distribute(
        self,
        name: str,
        targets: Iterable[str],
        *,
        version: str | None = None,
        on_transfer: Callable[[distribution.Transfer], None] | None = None,
    ) -> distribution.Plan:
        """Carry out the plan, pipelined: each copy starts as soon as its source holds the
        image and has finished its previous send, not when the whole round is over.

        Holders are recorded as copies complete; a failed copy fails the copies that depended
        on it, and the first error is raised after the others were recorded.
        """
        info = self.get(name, version)
        the_plan = self.plan(name, targets, version=info.version)

        def done(t: distribution.Transfer) -> None:
            self._record_holder(info, t.target, t.source)
            if on_transfer is not None:
                on_transfer(t)

        what = f"image {info.name} {info.version}"
        image_pipeline.carry_out(the_plan.transfers, what, lambda t: self._send(info, t), done)
        return the_plan

    def _send(self, info: ImageInfo, t: distribution.Transfer) -> None:
        src = self.image_path(t.source, info.name, info.version, info.format)
        if t.source == self.head:
            src = Path(info.path)
        dst = self.image_path(t.target, info.name, info.version, info.format)
        local = self.config.copy_method == "local"
        where = f"image {info.name} {info.version}: copy {t.source} -> {t.target}"
        try:
            if local:
                safe_dirs.ensure_dir(dst.parent, 0o755)
            transfer.copy(
                Endpoint(src, None if local else self.config.hosts.get(t.source, t.source)),
                Endpoint(dst, None if local else self.config.hosts.get(t.target, t.target)),
                method=self.config.copy_method,
                mode=0o644,
                timeout_s=self.config.operation_timeout_s,
            )
            for extra_src, extra_dst in zip(boot_paths(src), boot_paths(dst), strict=True):
                if local and extra_src.exists():
                    transfer.copy(Endpoint(extra_src), Endpoint(extra_dst), method="local", mode=0o644)
            if local and transfer.sha256_file(dst) != info.sha256:
                dst.unlink(missing_ok=True)
                raise VjobError(f"{where} has a wrong sha256")
            if local:
                write_index(dst.parent, info, cmdline=_read_cmdline(src.parent, info.name))
        except (OSError, safe_dirs.UnsafePathError) as exc:
            raise VjobError(f"{where}: {exc}") from None

    def _record_holder(self, info: ImageInfo, node: str, source: str) -> None:
        with self.store.session() as s:
            image_id = s.scalar(
                select(ImageRecord.id).where(ImageRecord.name == info.name, ImageRecord.version == info.version)
            )
            rec = s.get(NodeImageRecord, (node, image_id))
            if rec is None:
                s.add(NodeImageRecord(node=node, image_id=image_id, received_from=source, received_at=now()))
            else:
                rec.received_from, rec.received_at = source, now()

    def nodes_with(self, name: str) -> list[str]:
        """The nodes holding any version of image `name` (UBIS's N_availableOS counts these)."""
        with self.store.session() as s:
            rows = s.scalars(select(NodeImageRecord.node).join(ImageRecord).where(ImageRecord.name == name).distinct())
            return sorted(rows)

    def images_by_node(self) -> dict[str, list[str]]:
        """Per node, the image names it holds: the VM_os a node can run without provisioning."""
        with self.store.session() as s:
            rows = s.execute(select(NodeImageRecord.node, ImageRecord.name).join(ImageRecord).distinct())
            out: dict[str, list[str]] = {}
            for node, name in rows:
                out.setdefault(node, []).append(name)
        return {node: sorted(names) for node, names in sorted(out.items())}


def record_node_image(store: Store, node: str, image: str) -> bool:
    """Note that `node` runs a VM of catalogue image `image` now: it becomes the node's OS.

    Why in node_images: it is the one source of a node's OS (UBIS's VM_os, N_availableOS). A
    node that runs an image holds it, so the row is true for the distribution tree too; an
    existing row keeps whom the node received the image from, only `received_at` moves (it
    reads "received or last ran"). Nothing is written when the node's OS is already `image`
    (the agent calls this every tick for every running vjob). Returns False for an image
    the catalogue does not hold (the shipped counter guest): such a node carries no OS.
    """
    check_name("node", node)
    check_name("image", image)
    with store.session() as s:
        if _current_images(s, [node]).get(node) == image:
            return True
        image_id = s.scalar(
            select(ImageRecord.id)
            .where(ImageRecord.name == image)
            .order_by(ImageRecord.created_at.desc(), ImageRecord.id.desc())
        )
        if image_id is None:
            return False
        rec = s.get(NodeImageRecord, (node, image_id))
        if rec is None:
            s.add(NodeImageRecord(node=node, image_id=image_id, received_from=None, received_at=now()))
        else:
            rec.received_at = max(now(), rec.received_at + 1e-6)  # strictly the newest, even on a coarse clock
    return True


def node_os(store: Store, nodes: Iterable[str] | None = None) -> dict[str, str]:
    """Per node, its OS: the image it last ran or received (newest `received_at` wins)."""
    with store.session() as s:
        return _current_images(s, None if nodes is None else list(nodes))


def _current_images(s: Any, nodes: list[str] | None) -> dict[str, str]:
    query = select(NodeImageRecord.node, ImageRecord.name, NodeImageRecord.received_at).join(ImageRecord)
    if nodes is not None:
        query = query.where(NodeImageRecord.node.in_(nodes))
    newest: dict[str, tuple[float, str]] = {}
    for node, name, at in s.execute(query):
        if node not in newest or (at, name) > newest[node]:
            newest[node] = (at, name)
    return {node: name for node, (_, name) in sorted(newest.items())}


class StoreNodeOS:
    """The nodes' OS for an RMS adapter: `node_os` of the configured store, opened lazily.

    Why a callable apart from the agent's store: the adapters build the nodes of a view (also
    for `vjob prio --rms`) and have no store of their own. A store that fails gives no OS this
    time (the term then counts no node as running the image), logged, and is reopened next time:
    the nodes are still listed — the OS is a hint for the priority, never a reason to stop.
    """

    def __init__(self, config: Any) -> None:
        self.config = config
        self._store: Store | None = None

    def __call__(self) -> dict[str, str]:
        try:
            if self._store is None:
                self._store = open_store(self.config)
            return node_os(self._store)
        except VjobError as exc:
            _log.warning("nodes' OS images unavailable this time", error=str(exc))
            if self._store is not None:
                self._store.close()
            self._store = None
            return {}


def with_node_os(nodes: Iterable[Node], images: dict[str, str]) -> list[Node]:
    """The nodes with `os_image` from `images` where the RMS itself reported none."""
    return [replace(n, os_image=images[n.name]) if not n.os_image and n.name in images else n for n in nodes]


def _index_version(index: Path) -> str | None:
    try:
        return str(json.loads(index.read_text()).get("version"))
    except (OSError, ValueError, AttributeError):
        return None


def detect_format(file: Path) -> str:
    """qcow2 or raw, as qemu-img sees the file (a wrong format would corrupt the overlay)."""
    cmd = ["qemu-img", "info", "-U", "--output=json", str(file)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CommandError(cmd, str(exc)) from None
    if res.returncode != 0:
        raise InputError(f"--file {file}: not a disk image qemu-img can read: {res.stderr.strip()[-200:]}")
    fmt = str(json.loads(res.stdout).get("format", ""))
    if fmt not in ("qcow2", "raw"):
        raise InputError(f"--file {file}: format {fmt!r}: must be qcow2 or raw")
    return fmt
