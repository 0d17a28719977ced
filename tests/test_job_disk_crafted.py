"""Crafted job disks against the two readers of a job disk's /work (issue 39 items 1 and 5).

The disks are real ext4 file systems made with mkfs.ext4 and edited with `debugfs -w`, then with
a byte patch of a directory block where debugfs refuses a name (without metadata_csum, so
debugfs itself still reads them): a symlink followed by a file of the same name, a name holding
`../`, a 2 GiB sparse file and a file with 64 hard links in a qcow2 of about 1 MiB.

* Saline (item 1, root): the disk goes through the manager's socket as a submitter would pass
  it, and the manager deploys the vjob: a root-only file must keep its content, nothing may
  appear outside the scratch directory, and the vjob is refused naming why.
* The pilot's copy-back (`job_disk.collect`, as the job's user: a forked child that became
  `nobody`): a file of the user's outside the working directory keeps its content.
* Item 5: what the readers write (the kernel's `wchar` count of this process and its reaped
  children, the readers included) stays far below what the disk claims: sizes are checked
  before anything is written.
"""

from __future__ import annotations

import ctypes
import io
import os
import pwd
import random
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from plugins.oar.parse import OarJob
from provisioning import ext4_image, ext4_tree, job_disk
from saline_bew import client, deployment, journal, server, workdir
from saline_bew.manager import Manager
from tests.as_user import as_nobody
from tests.saline_env import FakeOar, make_real_image, stand_in_manager
from vjob.errors import InputError

DEBUGFS = shutil.which("debugfs") or "/usr/sbin/debugfs"
MKFS = shutil.which("mkfs.ext4") or "/usr/sbin/mkfs.ext4"
ESCAPE = b"vjobescape"


def _wchar() -> int:
    """Bytes this process and its reaped children passed to write(2) so far (/proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


def _craft(
    tmp: Path,
    stage: Path,
    commands: list[str],
    renames: dict[bytes, bytes],
    *,
    size_mb: int = 64,
    edit: Callable[[Path], None] | None = None,
) -> Path:
    """A qcow2 job disk: mkfs.ext4 -d `stage`, then `commands` through `debugfs -w`, then each
    name of `renames` (found exactly once in the image) patched in place to its crafted value,
    then `edit(raw image)`."""
    raw = tmp / "crafted.raw"
    with open(raw, "wb") as fh:
        fh.truncate(size_mb << 20)
    subprocess.run([MKFS, "-q", "-F", "-O", "^metadata_csum", "-d", str(stage), str(raw)], check=True, timeout=60)
    if commands:
        script = tmp / "crafted.debugfs"
        script.write_text("\n".join(commands) + "\n")
        subprocess.run([DEBUGFS, "-w", "-f", str(script), str(raw)], check=True, capture_output=True, timeout=60)
    image = bytearray(raw.read_bytes())
    for old, new in renames.items():
        assert len(old) == len(new) and image.count(old) == 1, old
        at = image.index(old)
        image[at : at + len(new)] = new
    raw.write_bytes(image)
    if edit is not None:
        edit(raw)
    disk = tmp / "crafted.work.qcow2"
    subprocess.run(
        ["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(disk)], check=True, timeout=60
    )
    raw.unlink()
    return disk


def _hostile_commands(tmp: Path, victim: Path, escape_levels: int) -> tuple[list[str], dict[bytes, bytes]]:
    """debugfs commands and patches for /work: `vjobdup` a symlink to `victim` then a file named
    `vjobdup` too, and a file named `../` × `escape_levels` + `vjobescape`."""
    payload = tmp / "payload"
    payload.write_bytes(b"PWNED by a crafted disk\n")
    placeholder = b"..Z" * escape_levels + ESCAPE
    commands = [
        f"symlink /work/vjobdup {victim}",
        f"write {payload} /work/vjobduX",
        f"write {payload} /work/{placeholder.decode()}",
    ]
    return commands, {b"vjobduX": b"vjobdup", placeholder: b"../" * escape_levels + ESCAPE}


def _claiming_stage(stage: Path) -> Path:
    """A tree whose /work claims 2 GiB + 16 MiB and holds 256 KiB: a 2 GiB sparse file and a
    256 KiB file with 64 more hard links (mkfs.ext4 -d keeps both the holes and the links)."""
    (stage / "work").mkdir(parents=True)
    with open(stage / "work" / "sparse", "wb") as fh:
        fh.truncate(2 << 30)
    (stage / "work" / "linked").write_bytes(os.urandom(256 << 10))
    for i in range(64):
        os.link(stage / "work" / "linked", stage / "work" / f"link{i}")
    return stage


def _escapes(where: Path) -> list[Path]:
    return [p for p in where.rglob("*") if p.name == ESCAPE.decode()]


# -- Saline: the root manager ---------------------------------------------------------------------
@pytest.fixture
def manager(tmp_path: Path, test_nodes: dict[str, str]) -> Iterator[Manager]:
    with FakeOar() as oar, stand_in_manager(tmp_path, test_nodes, oar) as m:
        make_real_image(m.ports.store, tmp_path)
        yield m


def _submit_disk(manager: Manager, tmp_path: Path, disk: Path) -> journal.SalineJob:
    """The disk passed open over the manager's socket, as `vjob besteffort submit` passes the
    one it builds, for the user `nobody`; then OAR starts the vjob's job."""
    sock = tmp_path / "sock" / "saline.sock"
    request = {
        "op": "submit",
        "image": "real",
        "command": ["./run"],
        "vms": 1,
        "vcpus": 1,
        "memory": 128,
        "walltime": "1:00:00",
        "site": None,
        "user": "nobody",
    }
    fd = os.open(disk, os.O_RDONLY)
    try:
        with server.Server(manager, sock):
            client.call(sock, request, fd=fd)
    finally:
        os.close(fd)
    (job,) = journal.all_jobs(manager.ports.store)
    assert manager.ports.vms.work_path(job.key).is_file(), "the manager kept its checked copy"
    return job


def _deploy(manager: Manager, job: journal.SalineJob) -> None:
    running = OarJob(id="2", state="Running", user=job.user, types=("besteffort",), hosts=("n1",), resources=(3,))
    deployment.deploy(manager.ports, journal.get(manager.ports.store, job.key), running)


def _refused(manager: Manager, job: journal.SalineJob) -> str:
    """The deployment's InputError message ('' when it deployed: then the checks say why)."""
    try:
        _deploy(manager, job)
    except InputError as exc:
        return str(exc)
    return ""


def test_a_crafted_disk_cannot_make_the_manager_write_through_a_link_or_outside(
    manager: Manager, tmp_path: Path
) -> None:
    """Item 1: a symlink entry then a file of the same name, and a name holding `../`: the
    manager refuses the disk, the root-only file keeps its content, nothing lands outside."""
    victim = tmp_path / "root-only"
    victim.write_text("ROOT ONLY\n")
    victim.chmod(0o600)
    stage = tmp_path / "stage"
    (stage / "work").mkdir(parents=True)
    (stage / "work" / "run").write_text("#!/bin/sh\necho hi\n")
    commands, renames = _hostile_commands(tmp_path, victim, escape_levels=5)
    job = _submit_disk(manager, tmp_path, _craft(tmp_path, stage, commands, renames))
    refusal = _refused(manager, job)
    assert victim.read_text() == "ROOT ONLY\n", "root wrote through the disk's symlink"
    assert not _escapes(tmp_path), "root created a file outside its scratch directory"
    assert re.search(r"the name b'vjobdup' twice|'\.\./\.\./", refusal), refusal
    assert not list((tmp_path / "vms").rglob(".vjob-work-*")), "scratch left behind"


def test_qemu_img_reads_the_users_disk_as_the_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root never runs an image tool on the image a user made: `qemu-img info` at the receipt
    and `convert` at the deployment run as the submitter (`nobody`, no groups), on descriptors
    of root's files, and the tree still comes back whole."""
    nobody = pwd.getpwnam("nobody")
    bindir = Path(tempfile.mkdtemp(prefix="vjob-qemu-img-", dir="/var/tmp"))
    try:
        bindir.chmod(0o755)
        log = bindir / "who"
        log.touch(mode=0o600)
        os.chown(log, nobody.pw_uid, nobody.pw_gid)
        real = shutil.which("qemu-img")
        assert real is not None
        spy = bindir / "qemu-img"
        spy.write_text(f'#!/bin/sh\necho "$(id -u) $(id -G) $1" >> {log}\nexec {real} "$@"\n')
        spy.chmod(0o755)
        stage = tmp_path / "stage"
        (stage / "work").mkdir(parents=True)
        (stage / "work" / "data.txt").write_text("the user's data\n")
        disk = _craft(tmp_path, stage, [], {})  # the user's disk, made before the spy is on PATH
        monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
        dest = tmp_path / "received.work.qcow2"
        fd = os.open(disk, os.O_RDONLY)
        try:
            workdir.receive(fd, dest, limit_bytes=8 << 20, uid=nobody.pw_uid, gid=nobody.pw_gid)
        finally:
            os.close(fd)
        assert dest.stat().st_uid == nobody.pw_uid and stat.S_IMODE(dest.stat().st_mode) == 0o600
        with workdir.unpacked(dest, tmp_path, uid=nobody.pw_uid, gid=nobody.pw_gid, limit_bytes=8 << 20) as work:
            assert (work / "data.txt").read_text() == "the user's data\n"
        who = f"{nobody.pw_uid} {nobody.pw_gid}"
        assert log.read_text().splitlines() == [f"{who} info", f"{who} convert"]
    finally:
        shutil.rmtree(bindir, ignore_errors=True)


def test_a_small_disk_claiming_gibibytes_is_refused_before_root_writes(manager: Manager, tmp_path: Path) -> None:
    """Item 5: a 2 GiB sparse file and a 256 KiB file with 64 hard links (16 MiB) in a disk
    whose qcow2 is under 2 MiB: refused on the apparent sizes with the limit named, and root wrote a
    few MiB at most (the raw image's data), not the gibibytes the disk claims."""
    disk = _craft(tmp_path, _claiming_stage(tmp_path / "stage"), [], {})
    assert disk.stat().st_size < 2 << 20
    job = _submit_disk(manager, tmp_path, disk)
    before = _wchar()
    refusal = _refused(manager, job)
    assert _wchar() - before < 32 << 20, "root wrote what the disk only claimed"
    assert re.search(r"more than \d+ bytes \(apparent sizes, every hard link and sparse file", refusal), refusal
    assert not list((tmp_path / "vms").rglob(".vjob-work-*"))


def test_the_stream_from_the_unprivileged_reader_is_checked_again(tmp_path: Path) -> None:
    """What root writes for Saline comes from a child it does not trust: a frame naming `..`,
    a link then a file of one name, a file under a link, data past a file's size or over the
    limit, and garbage are each refused (InputError), and nothing is created outside."""

    def stream(*frames: tuple[dict[str, object], bytes]) -> io.BytesIO:
        out = io.BytesIO()
        for header, payload in frames:
            ext4_tree._frame(out, header, payload)
        out.seek(0)
        return out

    def entry(path: list[bytes], kind: str, size: int = 0, target: bytes = b"") -> tuple[dict[str, object], bytes]:
        return {"entry": [[p.hex() for p in path], kind, 0o644, size, 0, target.hex()]}, b""

    outside = tmp_path / "outside"
    cases = {
        "dotdot": [entry([b".."], "dir")],
        "slash": [entry([b"../outside"], "file", 1)],
        "link then file": [entry([b"x"], "link", target=str(outside).encode()), entry([b"x"], "file", 1)],
        "under a link": [entry([b"x"], "link", target=str(tmp_path).encode()), entry([b"x", b"outside"], "file", 1)],
        "past its size": [entry([b"f"], "file", 4), ({"data": 2, "n": 4}, b"abcd")],
        "over the limit": [entry([b"f"], "file", 2 << 20)],
        "rewritten": [entry([b"f"], "file", 1 << 20)] + [({"data": 0, "n": 4096}, b"a" * 4096)] * 300,
        "garbage": [({"what": 1}, b"")],
        "no end": [entry([b"f"], "dir")],
    }
    for name, frames in cases.items():
        dest = tmp_path / f"dest-{name.replace(' ', '-')}"
        dest.mkdir()
        with pytest.raises(InputError):
            ext4_tree.receive(stream(*frames).read, dest, 1 << 20)
        assert not outside.exists(), name
    ok = tmp_path / "ok"
    ok.mkdir()
    deep = io.BytesIO(struct.pack(">I", 60000) + b"[" * 60000)  # json.loads: RecursionError, not ValueError
    with pytest.raises(InputError, match="garbled"):
        ext4_tree.receive(deep.read, ok, 1 << 20)
    frames = [entry([b"d"], "dir"), entry([b"d", b"f"], "file", 3), ({"data": 0, "n": 3}, b"abc"), ({"done": []}, b"")]
    assert ext4_tree.receive(stream(*frames).read, ok, 1 << 20) == []
    assert (ok / "d" / "f").read_bytes() == b"abc"


# -- the pilot's copy-back, as the job's user -----------------------------------------------------
@pytest.fixture
def user_dir() -> Iterator[Path]:
    """A directory of `nobody`'s (under a root directory others may traverse), removed after."""
    base = Path(tempfile.mkdtemp(prefix="vjob-crafted-"))
    os.chmod(base, 0o755)
    nobody = pwd.getpwnam("nobody")
    home = base / "u"
    home.mkdir()
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    try:
        yield home
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _collect_as_nobody(disk: Path, work: Path) -> tuple[int, str]:
    """`job_disk.collect(disk, work)` as `nobody` (tests.as_user): 0 collected, 3 refused with
    InputError (its message returned), anything else as_user's CRASHED and the exception."""

    def collect() -> int:
        try:
            job_disk.collect(disk, work)
        except InputError as exc:
            print(exc, file=sys.stderr)
            return 3
        return 0

    done = as_nobody(collect)
    return done.returncode, done.stderr


def _user_disk(home: Path, stage: Path, commands: list[str], renames: dict[bytes, bytes]) -> tuple[Path, Path]:
    """The crafted disk in the user's VM directory and an empty working directory, both the user's."""
    (stage / ".vjob").mkdir(parents=True, exist_ok=True)
    (stage / ".vjob" / "exit").write_text("0\n")
    vms, work = home / "vms", home / "work"
    for d in (vms, work):
        d.mkdir()
    disk = _craft(home.parent, stage, commands, renames)
    target = vms / "vm.job.qcow2"
    shutil.move(disk, target)
    nobody = pwd.getpwnam("nobody")
    for path in (vms, work, target):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    return target, work


def test_the_copy_back_as_the_user_never_writes_through_a_link_or_outside(user_dir: Path) -> None:
    """Item 1 on the pilot's side: a guest that wrote a symlink and a file of the same name, or
    a name holding `../`, cannot make the pilot (the user) write outside the scratch copy."""
    precious = user_dir / "precious"
    precious.write_text("the user's own file\n")
    nobody = pwd.getpwnam("nobody")
    os.chown(precious, nobody.pw_uid, nobody.pw_gid)
    stage = user_dir.parent / "stage"
    (stage / "work").mkdir(parents=True)
    # vms/.vjob-results-X/out/work/../../../.. is the user's directory
    commands, renames = _hostile_commands(user_dir.parent, precious, escape_levels=4)
    disk, work = _user_disk(user_dir, stage, commands, renames)
    code, message = _collect_as_nobody(disk, work)
    assert precious.read_text() == "the user's own file\n", "the copy-back wrote through the guest's symlink"
    assert not _escapes(user_dir.parent), "the copy-back wrote outside its scratch directory"
    assert code == 3 and "not copied back; the disk is kept" in message, message
    assert disk.exists() and not list(work.iterdir())


def test_the_copy_back_counts_sparse_files_and_links_before_writing(user_dir: Path) -> None:
    """Item 5 on the pilot's side: a 2 GiB sparse file and 64 links of a 256 KiB file on a
    64 MiB disk are over what the disk can hold: refused before the pilot writes them."""
    disk, work = _user_disk(user_dir, _claiming_stage(user_dir.parent / "stage"), [], {})
    before = _wchar()
    code, message = _collect_as_nobody(disk, work)
    assert _wchar() - before < 32 << 20, "the copy-back wrote what the disk only claimed"
    assert code == 3 and "apparent sizes" in message, message
    assert not list(work.iterdir())


@pytest.mark.parametrize(
    "features", [[], ["-b", "1024", "-O", "^extent,^64bit,^metadata_csum"]], ids=["ext4", "blockmap"]
)
def test_a_real_tree_comes_back_whole_through_the_reader(tmp_path: Path, features: list[str]) -> None:
    """The reader against what mkfs.ext4 -d writes (extents with an index node, or ext2 block
    maps with double indirect blocks; a directory big enough to be hashed; a slow symlink; a
    sparse file with holes; hard links, each copied): every byte, target, mode and time."""
    src = tmp_path / "src"
    (src / "work" / "deep" / "er").mkdir(parents=True)
    work = src / "work"
    (work / "deep" / "er" / "x.txt").write_text("deep\n")
    (work / "big.bin").write_bytes(os.urandom(3 << 20))
    with open(work / "holes.bin", "wb") as fh:  # six islands: more extents than fit in the inode
        for i in range(6):
            fh.seek(i * (256 << 10))
            fh.write(os.urandom(5000))
        fh.truncate(6 * (256 << 10) + 7)
    os.link(work / "big.bin", work / "big-again.bin")
    (work / "many").mkdir()
    for i in range(600):
        (work / "many" / f"file-with-a-longish-name-{i:04d}").write_text(str(i))
    (work / "short").symlink_to("deep/er/x.txt")
    (work / "long").symlink_to("/" + "l" * 120)
    (work / "exec.sh").write_text("#!/bin/sh\n")
    (work / "exec.sh").chmod(0o751)
    os.mkfifo(work / "fifo")
    raw = tmp_path / "fs.raw"
    with open(raw, "wb") as fh:
        fh.truncate(64 << 20)
    subprocess.run([MKFS, "-q", "-F", *features, "-d", str(src), str(raw)], check=True, timeout=60)
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(raw, os.O_RDONLY)
    try:
        image = ext4_image.Image(fd)
        tree = ext4_tree.scan(image, (b"work",), 64 << 20)
        ext4_tree.extract(image, tree, out, 64 << 20)
    finally:
        os.close(fd)
    assert tree.skipped == ["fifo"]
    for path in work.rglob("*"):
        got = out / path.relative_to(work)
        st, gst = path.lstat(), os.lstat(got) if os.path.lexists(got) else None
        if stat.S_ISFIFO(st.st_mode):
            assert gst is None
            continue
        assert gst is not None and stat.S_IFMT(gst.st_mode) == stat.S_IFMT(st.st_mode), path
        assert int(gst.st_mtime) == int(st.st_mtime), path
        if path.is_symlink():
            assert os.readlink(got) == os.readlink(path)
        elif path.is_file():
            assert got.read_bytes() == path.read_bytes(), path
            assert stat.S_IMODE(gst.st_mode) == stat.S_IMODE(st.st_mode), path
    assert (out / "holes.bin").stat().st_blocks * 512 < 1 << 20, "holes stay holes"
    assert (out / "big.bin").stat().st_ino != (out / "big-again.bin").stat().st_ino


def test_the_saline_reader_runs_as_the_user_and_cannot_be_traced(
    manager: Manager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root never parses the user's file system: the reader of a submitted disk runs in a
    child whose ids are the vjob user's (no groups) and that is not dumpable (another process
    of that user cannot ptrace it or open its /proc files). The reader here reports what it is
    instead of reading, through the stream the manager checks (its error frame)."""
    stage = tmp_path / "stage"
    (stage / "work").mkdir(parents=True)
    job = _submit_disk(manager, tmp_path, _craft(tmp_path, stage, [], {}))

    def whoami(fd: int, root: tuple[bytes, ...], limit_bytes: int, out: BinaryIO) -> None:
        ext4_tree._frame(out, {"error": _whoami()})

    monkeypatch.setattr(ext4_tree, "send", whoami)
    refusal = _refused(manager, job)
    assert _expected_whoami() in refusal and "provisioning.stage_limit_mb = 2048" in refusal, refusal


def _whoami() -> str:
    """What the reader in the child is, as it sees itself: its ids and groups, whether it is
    dumpable, and where its descriptors lead (standard streams first, then the rest sorted)."""
    dumpable = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
    links = {}
    for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
        try:
            links[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed since
            continue
    kinds = ["pipe" if v.startswith("pipe:") else "image" if v.endswith("/disk.raw") else v for v in links.values()]
    std = [links.get(fd, "closed") for fd in (0, 1, 2)]
    rest = sorted(kinds[3:]) if std == kinds[:3] else sorted(kinds)
    return (
        f"uid={os.getuid()},{os.geteuid()} gid={os.getgid()} groups={os.getgroups()} dumpable={dumpable} "
        f"std={std} others={rest}"
    )


def _expected_whoami() -> str:
    """`nobody`, no groups, not dumpable, /dev/null as its standard streams, and nothing open
    but the image and its pipe to root."""
    nobody = pwd.getpwnam("nobody")
    return (
        f"uid={nobody.pw_uid},{nobody.pw_uid} gid={nobody.pw_gid} groups=[] dumpable=0 "
        f"std={[os.devnull] * 3} others={['image', 'pipe']}"
    )


def test_the_exit_status_is_read_as_the_user_and_cannot_be_traced(
    manager: Manager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root never parses the user's file system, the exit file included: when a vjob on a real
    image ends, the manager reads /.vjob/exit off its job disk through a child that became the
    vjob's user (not dumpable, /dev/null as its standard streams, only the image and its pipe
    open). The real reader finds no exit file on a disk the job never ran on; then a reader
    that reports what it is comes back as the reason the exit status is unknown."""
    stage = tmp_path / "stage"
    (stage / "work").mkdir(parents=True)
    job = _submit_disk(manager, tmp_path, _craft(tmp_path, stage, [], {}))
    _deploy(manager, job)
    job = journal.get(manager.ports.store, job.key)
    assert manager.ports.vms.exit_status(job.vm_names[0], job.hosts[0], user=job.user) is None

    def whoami(fd: int, path: tuple[bytes, ...], most: int, out: BinaryIO) -> None:
        ext4_tree._frame(out, {"error": _whoami()})

    monkeypatch.setattr(ext4_tree, "send_small_file", whoami)
    deployment.complete(manager.ports, job)
    finished = journal.events(manager.ports.store, job.key)[-1]
    assert finished.kind == "finished" and finished.detail["exit_code"] is None, finished.detail
    assert _expected_whoami() in str(finished.detail.get("exit_error")), finished.detail


@pytest.mark.parametrize(
    "features", [[], ["-b", "1024", "-O", "^extent,^64bit,^metadata_csum"]], ids=["ext4", "blockmap"]
)
def test_a_damaged_file_system_is_refused_never_a_crash(tmp_path: Path, features: list[str]) -> None:
    """Seeded mutations (1 to 6 bytes among the image's non-zero ones: superblock, descriptors,
    inodes, extent and indirect blocks, directory blocks; the image is the same every run) of a
    small real file system: the
    reader either reads it or refuses it with InputError, whatever the bytes; never another
    exception (the pilot and the Saline child would die with a traceback)."""
    src = tmp_path / "src"
    (src / "work" / "d").mkdir(parents=True)
    work = src / "work"
    (work / "a.txt").write_text("hello\n")
    (work / "d" / "b").write_bytes(b"b" + bytes(69998) + b"b")  # mapping blocks, few non-zero data bytes
    (work / "l").symlink_to("a.txt")
    (work / "ll").symlink_to("/" + "x" * 100)
    for i in range(40):
        (work / "d" / f"name-{i:03d}").write_text(str(i))
    with open(work / "holes", "wb") as fh:
        for i in range(6):
            fh.seek(i * 65536)
            fh.write(b"z")
    for path in [src, *src.rglob("*")]:
        os.utime(path, (1_700_000_000, 1_700_000_000), follow_symlinks=False)
    raw = tmp_path / "fs.raw"
    with open(raw, "wb") as fh:
        fh.truncate(4 << 20)
    fixed = ["-U", "0b39e39e-0000-4000-8000-000000000039", "-E", "hash_seed=0b39e39e-0000-4000-8000-000000000039"]
    subprocess.run(
        [MKFS, "-q", "-F", *fixed, *features, "-d", str(src), str(raw)],
        check=True,
        timeout=60,
        env={**os.environ, "E2FSPROGS_FAKE_TIME": "1700000000"},
    )
    good = raw.read_bytes()
    places = [i for i, byte in enumerate(good) if byte]  # metadata, almost all of it
    rng = random.Random(39)
    outcomes = {"read": 0, "refused": 0}
    fd = os.open(raw, os.O_RDWR)
    try:
        for case in range(150):
            changed = sorted({rng.choice(places) for _ in range(rng.randint(1, 6))})
            for at in changed:
                os.pwrite(fd, bytes([rng.randrange(256)]), at)
            out = tmp_path / f"out{case}"
            out.mkdir()
            try:
                image = ext4_image.Image(fd)
                ext4_tree.extract(image, ext4_tree.scan(image, (b"work",), 16 << 20), out, 16 << 20)
                image.small_file((b".vjob", b"exit"), 16)
                outcomes["read"] += 1
            except InputError:
                outcomes["refused"] += 1
            for at in changed:
                os.pwrite(fd, good[at : at + 1], at)
            shutil.rmtree(out)
    finally:
        os.close(fd)
    assert outcomes["refused"] > 0 and outcomes["read"] > 0, outcomes


def test_the_saline_reader_needs_nothing_it_cannot_read_as_the_user(tmp_path: Path) -> None:
    """The child cannot read what only root may (here the interpreter itself lives under
    /root): it must import nothing after it became the user. In a fresh manager process (no
    module loaded by other tests), a good disk is unpacked whole and a crafted one is refused
    with its reason, not with "the stream ended early"; the exit file's reader (the same child)
    reads the good disk to its end too (no exit file there)."""
    stage = tmp_path / "stage"
    (stage / "work" / "sub dir é").mkdir(parents=True)
    (stage / "work" / "sub dir é" / "data").write_bytes(b"x" * 5000)
    good = _craft(tmp_path, stage, [], {})
    shutil.move(good, tmp_path / "good.qcow2")
    commands, renames = _hostile_commands(tmp_path, tmp_path / "nowhere", escape_levels=2)
    bad = _craft(tmp_path, stage, commands, renames)
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    script = f"""
import pwd
from pathlib import Path
from saline_bew import workdir
from vjob.errors import InputError
nobody = pwd.getpwnam("nobody")
with workdir.unpacked(Path({str(tmp_path / "good.qcow2")!r}), Path({str(scratch)!r}), uid=nobody.pw_uid,
                      gid=nobody.pw_gid, limit_bytes=1 << 20) as work:
    print((work / "sub dir é" / "data").stat().st_size)
try:
    with workdir.unpacked(Path({str(bad)!r}), Path({str(scratch)!r}), uid=nobody.pw_uid, gid=nobody.pw_gid,
                          limit_bytes=1 << 20):
        print("unpacked")
except InputError as exc:
    print(exc)
from provisioning import job_disk
print(job_disk.read_exit(Path({str(tmp_path / "good.qcow2")!r}), Path({str(scratch)!r}), uid=nobody.pw_uid,
                         gid=nobody.pw_gid))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent.parent
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "5000" and ("twice" in lines[1] or "'../../" in lines[1]), lines
    assert lines[2] == "None", "the exit file's reader, as the user, found no exit file"


# -- a hostile eye on the reader: bounds a crafted image must not pass ----------------------------
def _mkfs(tmp: Path, src: Path, size_mb: int, *features: str) -> Path:
    """A raw ext4 image of `src` (mkfs.ext4 -d, no metadata checksums: the edits stay readable)."""
    raw = tmp / "fs.raw"
    with open(raw, "wb") as fh:
        fh.truncate(size_mb << 20)
    subprocess.run(
        [MKFS, "-q", "-F", "-O", "^metadata_csum", *features, "-d", str(src), str(raw)], check=True, timeout=60
    )
    return raw


def _read_all(raw: Path, out: Path, limit: int = 64 << 20) -> ext4_tree.Tree:
    """Scan and extract `raw`'s /work into `out`, as the pilot and the Saline child do."""
    out.mkdir()
    fd = os.open(raw, os.O_RDONLY)
    try:
        image = ext4_image.Image(fd)
        tree = ext4_tree.scan(image, (b"work",), limit)
        ext4_tree.extract(image, tree, out, limit)
        return tree
    finally:
        os.close(fd)


def _inode_offset(raw: Path, path: str, block_size: int) -> int:
    """Where debugfs says the inode at `path` lies in `raw` (`imap`: its block and offset)."""
    said = subprocess.run(
        [DEBUGFS, "-R", f"imap {path}", str(raw)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    found = re.search(r"located at block (\d+), offset 0x([0-9a-f]+)", said)
    assert found, said
    return int(found.group(1)) * block_size + int(found.group(2), 16)


def test_a_superblock_claiming_a_bigger_disk_does_not_raise_the_copy_back_limit(tmp_path: Path) -> None:
    """The pilot's limit is the disk's own capacity, taken from the superblock the guest wrote:
    one claiming 1000 times its blocks let 16 MiB of hard links come back from an 8 MiB disk
    (any amount, with more links). No file system is bigger than its image: refused."""
    stage = tmp_path / "stage"
    (stage / "work").mkdir(parents=True)
    (stage / "work" / "linked").write_bytes(os.urandom(64 << 10))
    for i in range(255):
        os.link(stage / "work" / "linked", stage / "work" / f"link{i}")

    def claim_more(raw: Path) -> None:
        with open(raw, "r+b") as fh:
            fh.seek(1024 + 4)  # s_blocks_count_lo
            (blocks,) = struct.unpack("<I", fh.read(4))
            fh.seek(1024 + 4)
            fh.write(struct.pack("<I", blocks * 1000))

    disk = _craft(tmp_path, stage, [], {}, size_mb=8, edit=claim_more)
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(InputError, match=r"superblock claims .* more than the image.*not copied back"):
        job_disk.collect(disk, work)
    assert not list(work.iterdir())


def test_an_extent_index_naming_one_leaf_many_times_is_refused(tmp_path: Path) -> None:
    """An extent index whose entries all name the same leaf made the reader walk that leaf's
    extents once per entry (and a leaf can be named by up to MAX_EXTENT_NODES entries, each
    with thousands of extents: minutes of a root child's time for one file). ext4 keeps a
    tree's extents in logical order without overlaps; the reader now refuses the second visit."""
    src = tmp_path / "src"
    (src / "work").mkdir(parents=True)
    with open(src / "work" / "islands", "wb") as fh:  # six extents: more than the inode holds, one leaf
        for i in range(6):
            fh.seek(i * (64 << 10))
            fh.write(os.urandom(3000))
    raw = _mkfs(tmp_path, src, 8)
    _read_all(raw, tmp_path / "good")  # the real tree reads
    fd = os.open(raw, os.O_RDWR)
    try:
        image = ext4_image.Image(fd)
        inode = image.lookup((b"work", b"islands"))
        assert inode is not None
        magic, entries, _most, depth, generation = struct.unpack_from("<HHHHI", inode.block, 0)
        assert (magic, entries, depth) == (0xF30A, 1, 1), "mkfs made no index node"
        _first, leaf_lo, leaf_hi = struct.unpack_from("<IIH", inode.block, 12)
        index = b"".join(struct.pack("<IIHH", i, leaf_lo, leaf_hi, 0) for i in range(4))
        header = struct.pack("<HHHHI", magic, 4, 4, 1, generation)  # 4 entries: all the inode holds
        os.pwrite(fd, header + index, _inode_offset(raw, "/work/islands", image.bs) + 0x28)
    finally:
        os.close(fd)
    with pytest.raises(InputError, match="extents empty, out of order or overlapping"):
        _read_all(raw, tmp_path / "crafted")


def test_a_huge_directory_is_refused_before_all_its_names_are_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory may be 64 MiB: some 5 million 12-byte records, all held at once before the
    entry limit was counted (gibibytes of names in the reader). A directory is read up to the
    entry limit, not past it (the limit made small here)."""
    src = tmp_path / "src"
    (src / "work" / "many").mkdir(parents=True)
    for i in range(300):
        (src / "work" / "many" / f"n{i}").write_text("")
    raw = _mkfs(tmp_path, src, 8)
    monkeypatch.setattr(ext4_image, "MAX_ENTRIES", 100)
    fd = os.open(raw, os.O_RDONLY)
    try:
        image = ext4_image.Image(fd)
        many = image.lookup((b"work", b"many"))
        assert many is not None
        with pytest.raises(InputError, match="more than 100 entries"):
            image.listing(many, "work/many")
    finally:
        os.close(fd)


def test_a_path_too_long_to_write_is_refused_never_a_crash(tmp_path: Path) -> None:
    """Names of 255 bytes, 20 levels deep: a path over PATH_MAX made the writer's mkdir fail with
    ENAMETOOLONG (an OSError out of the pilot's copy-back and out of root's writer, not a
    refusal). Paths are bounded: the scan and the writer refuse them with InputError."""
    src = tmp_path / "src"
    (src / "work").mkdir(parents=True)
    names = [bytes([ord("a") + i]) * 250 for i in range(20)]
    fd = os.open(src / "work", os.O_RDONLY)
    for name in names:  # below PATH_MAX at each step: relative to the directory made last
        os.mkdir(name, dir_fd=fd)
        fd, parent = os.open(name, os.O_RDONLY, dir_fd=fd), fd
        os.close(parent)
    os.close(fd)
    with pytest.raises(InputError, match=r"a path over \d+ bytes"):
        _read_all(_mkfs(tmp_path, src, 8), tmp_path / "out")
    frames = io.BytesIO()
    for depth in range(1, len(names) + 1):
        ext4_tree._frame(frames, {"entry": [[n.hex() for n in names[:depth]], "dir", 0o755, 0, 0, ""]})
    frames.seek(0)
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(InputError, match="path length, depth or entry count out of bounds"):
        ext4_tree.receive(frames.read, dest, 1 << 20)


def test_skipped_special_files_count_towards_the_entry_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FIFOs, sockets and devices are skipped, but each was an inode read and a name kept: they
    did not count towards the entry limit, so a disk of FIFOs (millions fit in its directories)
    held them all. They count now, and only the first MAX_SKIPPED are named (limit small here)."""
    src = tmp_path / "src"
    (src / "work" / "d").mkdir(parents=True)
    for i in range(150):
        os.mkfifo(src / "work" / "d" / f"f{i}")
    raw = _mkfs(tmp_path, src, 8)
    assert len(_read_all(raw, tmp_path / "all").skipped) == 100  # MAX_SKIPPED of 150
    monkeypatch.setattr(ext4_image, "MAX_ENTRIES", 100)
    with pytest.raises(InputError, match="more than 100 entries"):
        _read_all(raw, tmp_path / "out")


def test_the_exit_file_from_the_unprivileged_reader_is_checked_again(tmp_path: Path) -> None:
    """Root takes from the exit file's reader one frame: the file's bytes (at most what it asked
    for, in hex), none, or the reader's error; anything else is refused, never trusted."""

    def frame(header: dict[str, object]) -> Callable[[int], bytes]:
        out = io.BytesIO()
        ext4_tree._frame(out, header)
        out.seek(0)
        return out.read

    assert ext4_tree.receive_small_file(frame({"file": b"3\n".hex()}), 16) == b"3\n"
    assert ext4_tree.receive_small_file(frame({"file": None}), 16) is None
    for bad in ({"file": "41" * 17}, {"file": "zz"}, {"file": 3}, {"data": 0}, {"error": "refused"}):
        with pytest.raises(InputError):
            ext4_tree.receive_small_file(frame(bad), 16)
    with pytest.raises(InputError):
        ext4_tree.receive_small_file(io.BytesIO(b"\0\0").read, 16)
