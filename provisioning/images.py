"""The OS image catalogue: which images exist, their checksums, which nodes hold them and the
one each node runs (the image it last ran or received: its OS, UBIS's VM_os).

Why in the store: UBIS's priority needs N_availableOS (the nodes already holding a job's
OS, a node's VM_os attribute) and the distribution tree needs who received each image from
whom; both must survive restarts and be shared by every agent. The image files themselves
live in `image_dir` on each node (the head node's copy is the catalogue's).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sqlalchemy import select

from provisioning import distribution, image_files, image_pipeline, safe_dirs, transfer
from provisioning.image_files import INDEX_SUFFIX, ImageFiles, Place, boot_paths
from provisioning.transfer import Endpoint
from provisioning.vm_types import check_name
from vjob import log
from vjob.config import ProvisioningConfig
from vjob.errors import CommandError, InputError, VjobError
from vjob.model import Node
from vjob.store.db import Store, now, open_store
from vjob.store.schema import ImageRecord, NodeImageRecord, VMRecord

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


@dataclass
class Removal:
    """One image version removed: the other nodes its copies were removed from, and the ones
    not reached (node → why, with where its copy stays)."""

    info: ImageInfo
    nodes: list[str] = field(default_factory=list)
    left: dict[str, str] = field(default_factory=dict)


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
        try:
            info = self.get(name)
        except InputError:
            info = None
        # The file's digest only when there is an entry to compare it with: `add` hashes its copy
        # anyway (a 400 MB image: 2 s of CPU saved per new catalogue, every real-guest test's).
        if info is None or not Path(info.path).is_file() or info.sha256 != transfer.sha256_file(file):
            info = self.add(name, file, version=time.strftime("%Y%m%d.%H%M%S"))
        target = Path(info.path)
        for src, dst in zip((kernel, initrd), boot_paths(target), strict=True):
            transfer.copy(Endpoint(src), Endpoint(dst), method="local", mode=0o644)
        record = image_files.make_record(info, cmdline, check_disk=False)  # its digest was just compared
        image_files.write_record(target, record)
        transfer.write_text(Endpoint(target.parent / record.index_name()), record.index_text(target.parent), mode=0o644)
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
        disk = image_files.FileRecord("disk", target.name, target.stat().st_size, digest)
        image_files.write_record(target, ImageFiles(name, version, fmt, "", (disk,)))
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

    def remove(self, name: str, *, version: str | None = None, force: bool = False) -> list[Removal]:
        """Forget the image (all versions unless `version`) and delete its files on every node
        that holds it, the head's last.

        Refused while a VM recorded in the store is built on it: its overlay needs it. Each other
        holder's copy is withdrawn (image_files.withdraw) and the node stops being a holder as
        soon as it is gone. A holder that cannot be reached stops the removal before the
        catalogue forgets anything (VjobError naming it): the image stays, with the nodes still
        holding it, so running the command again finishes the work. With `force` the image is
        forgotten anyway and each unreached node's leftover directory is returned to be said.
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
            infos = [self._info(s, r) for r in recs]
        done = [self._withdraw(info) for info in infos]
        unreached = [
            f"{info.name} {info.version} on {node}: {why}"
            for info, r in zip(infos, done, strict=True)
            for node, why in r.left.items()
        ]
        if unreached and not force:
            raise VjobError(
                f"image {name}: not removed, a holder was not reached ({'; '.join(unreached)[:600]}); the "
                "catalogue keeps it with the nodes still holding it: run the same command again once they "
                "answer, or add --force to forget it and leave their copies"
            )
        with self.store.session() as s:
            for rec in s.scalars(select(ImageRecord).where(ImageRecord.id.in_([r.id for r in recs]))):
                s.delete(rec)
        for info in infos:
            Path(info.path).unlink(missing_ok=True)
            for extra in (*boot_paths(Path(info.path)), image_files.record_path(Path(info.path))):
                extra.unlink(missing_ok=True)
            index = Path(info.path).parent / f"{info.name}{INDEX_SUFFIX}"
            if _index_version(index) == info.version:
                index.unlink(missing_ok=True)
        return done

    def _withdraw(self, info: ImageInfo) -> Removal:
        """`info`'s copies on its holders other than the head removed, each holder forgotten as
        its copy goes; the ones not reached are kept as holders and named with the error."""
        record = self.files(info)
        out = Removal(info)
        for node in sorted(info.holders):
            if node == self.head:
                continue
            place = self.place(node, info)
            try:
                image_files.withdraw(record, place, timeout_s=self.config.operation_timeout_s)
            except (OSError, VjobError) as exc:
                out.left[node] = f"{str(exc)[:200]} (its copy stays in {place.directory})"
                continue
            self._forget_holder(info, node)
            out.nodes.append(node)
        return out

    def files(self, info: ImageInfo, *, keep: bool = False) -> ImageFiles:
        """Every file a node needs for `info`, with sizes and sha256 (image_files): the record
        beside the catalogue's disk, made from the head's files for an image added before
        records were kept (written there when `keep`)."""
        record = image_files.read_record(info)
        if record is None:
            head_dir = Path(info.path).parent
            record = image_files.make_record(info, image_files.previous_cmdline(head_dir, info.name))
            if keep:
                image_files.write_record(Path(info.path), record)
        return record

    def place(self, node: str, info: ImageInfo) -> Place:
        """`node`'s image directory for `info`: the catalogue's own on the head (this machine),
        over ssh (`hosts`) on the others unless copies are local."""
        if node == self.head:
            return Place(node, Path(info.path).parent, None)
        host = None if self.config.copy_method == "local" else (self.config.hosts.get(node, node) or None)
        return Place(node, self.image_dir(node), host)

    def node_states(self, info: ImageInfo, *, hashed: bool) -> dict[str, dict[str, str]]:
        """Per holder of `info`, what each of its files is on that node (image_files.check);
        a node that cannot be reached reads {"node": the error}."""
        record = self.files(info)
        out: dict[str, dict[str, str]] = {}
        for node in info.holders:
            try:
                states = image_files.check(record, self.place(node, info), hashed=hashed)
            except (OSError, VjobError) as exc:
                states = {"node": f"unreachable: {str(exc)[:200]}"}
            index = states.get(image_files.INDEX, "")
            if node == self.head and (index == image_files.MISSING or index.startswith("names version")):
                states.pop(image_files.INDEX)  # the head needs none: an index there is for a pilot on it
            out[node] = states
        return out

    def verify(self, name: str | None = None) -> list[str]:
        """Hash every file of every image on every holder, where it is (over ssh for another
        host); returns the problems (empty: all good). An index naming another version is no
        problem: the node's pilots run that one."""
        problems = []
        for info in [self.get(name)] if name else self.list():
            for node, states in self.node_states(info, hashed=True).items():
                for role, state in states.items():
                    if state != image_files.OK and not state.startswith("names version"):
                        problems.append(f"image {info.name} {info.version} on node {node}: {role} {state}")
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
        on_transfer: Callable[[distribution.Transfer, list[str]], None] | None = None,
    ) -> distribution.Plan:
        """Put the whole image (image_files: disk, kernel, initrd, index) on every target,
        pipelined along the tree: each copy starts as soon as its source holds the image and
        has finished its previous send, not when the whole round is over.

        Every target is checked, recorded holders too (a node's copy may have been damaged or
        wiped since): a file already there with the recorded size and sha256 is not copied,
        so a re-run copies nothing. Holders are recorded as copies complete; a target whose
        copy failed is no longer recorded as a holder; a failed copy fails the copies that
        depended on it, and the first error is raised after the others were recorded.
        `on_transfer` gets each completed transfer and the files it copied.
        """
        info = self.get(name, version)
        wanted = list(targets)
        if not wanted:
            raise InputError("image distribute: --nodes: give at least one node")
        record = self.files(info, keep=True)
        tree = self.tree([*wanted, *info.holders])
        sources = [h for h in info.holders if h not in wanted]
        the_plan = distribution.plan(f"{info.name}-{info.version}", tree, sources, wanted)
        copied: dict[str, list[str]] = {}

        def send(t: distribution.Transfer) -> None:
            copied[t.target] = self._send(info, record, t)

        def done(t: distribution.Transfer) -> None:
            if copied[t.target] or t.target not in info.holders:
                self._record_holder(info, t.target, t.source)
            if on_transfer is not None:
                on_transfer(t, copied[t.target])

        image_pipeline.carry_out(the_plan.transfers, f"image {info.name} {info.version}", send, done)
        return the_plan

    def _send(self, info: ImageInfo, record: ImageFiles, t: distribution.Transfer) -> list[str]:
        source, target = self.place(t.source, info), self.place(t.target, info)
        try:
            image_files.ensure_place(target)
            return image_files.install(
                record, source, target, method=self.config.copy_method, timeout_s=self.config.operation_timeout_s
            )
        except (OSError, VjobError) as exc:
            self._forget_holder(info, t.target)
            if isinstance(exc, VjobError) and str(exc).startswith(f"image {info.name} {info.version}: copy"):
                raise
            raise VjobError(f"image {info.name} {info.version}: copy {t.source} -> {t.target}: {exc}") from None

    def _forget_holder(self, info: ImageInfo, node: str) -> None:
        """`node` no longer counts as holding `info` (its copy is not whole)."""
        with self.store.session() as s:
            image_id = s.scalar(
                select(ImageRecord.id).where(ImageRecord.name == info.name, ImageRecord.version == info.version)
            )
            rec = s.get(NodeImageRecord, (node, image_id))
            if rec is not None:
                s.delete(rec)

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
