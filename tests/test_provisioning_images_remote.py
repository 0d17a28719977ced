"""`vjob image distribute` to nodes sharing no directory with the controller.

The nodes b1..b4 are the second host of tests/services/second_host.py (its own tmpfs at the
same path as this host's directory, reached over ssh as a real node is): each has its own
image directory there (`image_dir = <root>/img/{node}`); b3 is reached through a second ssh
name of that host, so a copy between b1 and b3 is one between two other hosts (relayed by
`scp -3`), and one between b1 and b4 a copy on one other host. No guest is booted: the pilot's
own reader (provisioning.images.local_image, what pilot.specs.check_image calls) is run on the
second host and must find the image whole there. Checked:
- every file a pilot opens (disk, kernel, initrd, index) is on each node, hashed there, and
  `vjob image list` / `verify` say so; none of it is on this host's disk;
- a re-run copies nothing (no copy command runs, inodes unchanged);
- a node whose kernel was wiped shows "not whole"; a kernel altered on the way (a wrapper
  named rsync first on PATH flips one byte of what it sends) is refused naming node and file,
  the copy removed, the node's index withdrawn (the pilot refuses the image) and the node no
  longer recorded as a holder; the next run copies just the kernel and the index.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from provisioning import transfer
from provisioning.images import Catalogue
from tests.services.second_host import SecondHost, second_host  # noqa: F401 - fixture
from vjob.cli import main
from vjob.config import load
from vjob.errors import VjobError
from vjob.store.db import open_store

pytestmark = pytest.mark.libvirt

NODES = ("b1", "b2", "b3", "b4")
REAL_RSYNC = shutil.which("rsync") or "/usr/bin/rsync"
REPO = Path(__file__).resolve().parents[1]
WRAPPER = """#!/usr/bin/python3
# rsync, with every call logged; in corrupt mode a local source ending in .vmlinuz is sent as a
# copy with one byte changed in its middle (its size kept): altered on the way.
import os, sys, tempfile
args = sys.argv[1:]
with open(os.environ["RSYNC_CALLS"], "a") as log:
    log.write(" ".join(args) + "\\n")
if os.environ.get("RSYNC_MODE") == "corrupt":
    for i, a in enumerate(args):
        if a.endswith(".vmlinuz") and os.path.isfile(a):
            data = bytearray(open(a, "rb").read())
            data[len(data) // 2] ^= 0x01
            fd, bad = tempfile.mkstemp(suffix=".vmlinuz")
            os.write(fd, data)
            os.close(fd)
            args[i] = bad
os.execv({real!r}, [{real!r}, *args])
"""


@dataclass
class Site:
    host: SecondHost
    config: Path
    catalogue: Catalogue
    image: str
    work: Path

    def dir(self, node: str) -> Path:
        return self.host.root / "img" / node

    def remote_digests(self, node: str) -> dict[str, str]:
        """sha256 of every file in the node's image directory, computed on the second host."""
        out = self.sh(f"cd {self.dir(node)} && sha256sum -- * .[!.]* 2>/dev/null || true")
        return {line.split()[1]: line.split()[0] for line in out.splitlines() if line.strip()}

    def pilot_view(self, node: str) -> dict[str, str] | None:
        """What the pilot's reader finds on the second host (local_image there), None: no image."""
        code = (
            "import json, sys; from pathlib import Path; from provisioning import images; "
            "from vjob.config import ProvisioningConfig; "
            f"i = images.local_image(ProvisioningConfig(image_dir={str(self.host.root / 'img' / '{node}')!r}), "
            f"Path('/nonexistent'), {node!r}, {self.image!r}); "
            "print(json.dumps(None if i is None else "
            "{'disk': str(i.path), 'kernel': str(i.kernel), 'initrd': str(i.initrd), 'cmdline': i.cmdline}))"
        )
        out = self.sh(f"cd {REPO} && .venv/bin/python -c {shlex.quote(code)}", timeout_s=120)
        return json.loads(out.strip().splitlines()[-1])

    def sh(self, script: str, timeout_s: float = 60.0) -> str:
        """A shell script on the second host (run_on quotes it as one argument)."""
        return transfer.run_on(self.host.ssh_host, ["sh", "-c", script], timeout_s=timeout_s)

    def vjob(self, *argv: str) -> int:
        return main(["--config", str(self.config), *argv])


@pytest.fixture(scope="module")
def site(second_host: SecondHost, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:  # noqa: F811
    work = tmp_path_factory.mktemp("images-remote")
    alias = work / "ssh_config"  # b3 reached under another name: two "other hosts" for ssh
    named = f"Host {second_host.ssh_host}\n"
    alias.write_text(second_host.ssh_config.read_text().replace(named, named[:-1] + " vjob-hostb-alias\n"))
    previous = os.environ["VJOB_SSH_CONFIG"]
    os.environ["VJOB_SSH_CONFIG"] = str(alias)
    img = second_host.root / "img"  # the same path on both hosts, other contents
    hosts = {"a": "", "b1": second_host.ssh_host, "b2": second_host.ssh_host, "b3": "vjob-hostb-alias"}
    hosts["b4"] = second_host.ssh_host
    config = work / "vjob.toml"
    config.write_text(
        f'data_dir = "{work / "data"}"\n[provisioning]\nhead_node = "a"\nimage_dir = "{img}/{{node}}"\n'
        'copy_method = "rsync"\noperation_timeout_s = 120\n[provisioning.nodes]\n'
        + "".join(f'{n} = "test:///default"\n' for n in ("a", *NODES))
        + "[provisioning.hosts]\n"
        + "".join(f'{n} = "{h}"\n' for n, h in hosts.items())
    )
    assert main(["--config", str(config), "db", "upgrade"]) == 0
    cfg = load(config)
    catalogue = Catalogue(open_store(cfg), cfg.provisioning, data_dir=cfg.data_path)
    rng = random.Random(36)
    src = work / "src"
    src.mkdir()
    disk = src / "image.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "16M"], check=True, timeout=30)
    (src / "vmlinuz").write_bytes(rng.randbytes(300_000))
    (src / "initrd").write_bytes(rng.randbytes(200_000))
    info = catalogue.add_or_reuse(
        "site", disk, kernel=src / "vmlinuz", initrd=src / "initrd", cmdline="root=/dev/vda init=/sbin/vjob-init"
    )
    try:
        yield Site(second_host, config, catalogue, info.name, work)
    finally:
        catalogue.store.close()
        transfer.close_connections()
        os.environ["VJOB_SSH_CONFIG"] = previous
        shutil.rmtree(img, ignore_errors=True)  # this host's side (the head's catalogue)
        second_host.run("rm", "-rf", "--", str(img))  # the nodes' side


def _wrapped_rsync(site: Site, monkeypatch: pytest.MonkeyPatch, mode: str) -> Path:
    bindir = site.work / f"bin-{mode}"
    bindir.mkdir(exist_ok=True)
    (bindir / "rsync").write_text(WRAPPER.format(real=REAL_RSYNC))
    (bindir / "rsync").chmod(0o755)
    calls = site.work / f"rsync-calls-{mode}"
    calls.write_text("")
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("RSYNC_CALLS", str(calls))
    monkeypatch.setenv("RSYNC_MODE", mode)
    return calls


def _listed(site: Site, capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, object]]:
    capsys.readouterr()
    assert site.vjob("image", "list", "--json") == 0
    (image,) = json.loads(capsys.readouterr().out)
    return image["nodes"]


def test_1_every_file_a_pilot_opens_arrives_whole_and_verifies(
    site: Site, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _wrapped_rsync(site, monkeypatch, "log")
    assert site.vjob("image", "distribute", site.image, "--nodes", ",".join(NODES)) == 0
    out = capsys.readouterr().out
    assert "round 2: b1 -> b3" in out and "round 3: b1 -> b4" in out  # relayed by the nodes
    assert out.count("copied: disk, kernel, initrd, index") == 4
    info = site.catalogue.get(site.image)
    head = Path(info.path).parent
    expected = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in head.iterdir() if ".files." not in p.name}
    assert sorted(expected) == sorted(
        [Path(info.path).name, f"{Path(info.path).stem}.vmlinuz", f"{Path(info.path).stem}.initrd", "site.image.json"]
    )
    for node in NODES:
        found = site.remote_digests(node)
        index = json.loads(site.host.run("cat", str(site.dir(node) / "site.image.json")))
        assert index["path"] == str(site.dir(node) / Path(info.path).name)  # the node's own paths
        assert {k: v for k, v in found.items() if k != "site.image.json"} == {
            k: v for k, v in expected.items() if k != "site.image.json"
        }, node
        assert "site.image.json" in found and not any(".incoming" in k or ".part" in k for k in found)
        assert not site.dir(node).exists()  # nothing of it on this host's disk
        if node in ("b1", "b2"):
            continue  # the pilot's reader is run where the copies were relayed: b3 (scp -3), b4 (on the host)
        view = site.pilot_view(node)
        assert view == {
            "disk": index["path"],
            "kernel": index["kernel"],
            "initrd": index["initrd"],
            "cmdline": "root=/dev/vda init=/sbin/vjob-init",
        }
    copies = calls.read_text().splitlines()
    assert len(copies) == 6 and not any("alias" in c for c in copies)  # a -> b1, b2 by rsync; b1 -> b3 by scp -3
    nodes = _listed(site, capsys)
    assert {n: v["state"] for n, v in nodes.items()} == {n: "whole" for n in ("a", *NODES)}
    assert site.vjob("image", "verify") == 0  # every copy hashed where it lies


def test_2_a_rerun_copies_nothing(
    site: Site, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _wrapped_rsync(site, monkeypatch, "log")
    inodes = {n: site.sh(f"stat -c '%n %i %Y' {site.dir(n)}/*") for n in NODES}
    capsys.readouterr()
    assert site.vjob("image", "distribute", site.image, "--nodes", ",".join(NODES)) == 0
    assert capsys.readouterr().out.count("whole already: nothing copied") == 4
    assert calls.read_text() == ""  # no rsync (nor any copy) ran
    assert {n: site.sh(f"stat -c '%n %i %Y' {site.dir(n)}/*") for n in NODES} == inodes


def test_3_an_altered_file_is_refused_and_nothing_half_installed_is_left(
    site: Site, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    info = site.catalogue.get(site.image)
    kernel = f"{Path(info.path).stem}.vmlinuz"
    site.host.run("rm", "-f", str(site.dir("b2") / kernel))
    nodes = _listed(site, capsys)
    assert nodes["b2"]["whole"] is False and nodes["b2"]["state"] == "not whole: kernel missing"
    assert [p for p in site.catalogue.verify() if "b2" in p] == [
        f"image site {info.version} on node b2: kernel missing"
    ]

    calls = _wrapped_rsync(site, monkeypatch, "corrupt")
    with pytest.raises(VjobError) as refused:
        site.catalogue.distribute(site.image, ["b2"])
    message = str(refused.value)
    assert f"copy a -> b2: kernel {kernel} arrived sha256" in message and "removed" in message
    assert kernel in calls.read_text()  # the real copy ran (through the wrapper)
    left = site.remote_digests("b2")
    assert kernel not in left and not any(".incoming" in k or ".part" in k for k in left)
    assert "site.image.json" not in left and site.pilot_view("b2") is None  # the pilot refuses it
    assert "b2" not in site.catalogue.get(site.image).holders
    assert site.vjob("image", "distribute", site.image, "--nodes", "b2") == 1
    assert "b2: kernel" in capsys.readouterr().err

    _wrapped_rsync(site, monkeypatch, "log")
    seen: dict[str, list[str]] = {}
    site.catalogue.distribute(site.image, ["b2"], on_transfer=lambda t, files: seen.update({t.target: files}))
    assert seen == {"b2": ["kernel", "index"]}  # the disk and initrd that were whole stayed
    assert site.pilot_view("b2") is not None and site.catalogue.verify() == []


def test_4_remove_takes_every_nodes_copy_over_ssh(site: Site, capsys: pytest.CaptureFixture[str]) -> None:
    info = site.catalogue.get(site.image)
    assert set(info.holders) == {"a", *NODES}
    capsys.readouterr()
    assert site.vjob("image", "remove", site.image) == 0
    assert f"from {', '.join(NODES)}" in capsys.readouterr().out
    for node in NODES:  # disk, kernel, initrd and index gone on the second host, nothing staged left
        assert site.remote_digests(node) == {}, node
    assert site.pilot_view("b3") is None and not Path(info.path).exists()
    assert site.catalogue.list() == []
