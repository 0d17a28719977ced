"""The OS image catalogue, the binary distribution tree and the `vjob image` / `vjob vm` commands."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioning import distribution, images
from provisioning.images import Catalogue
from tests.services.libvirt import make_test_node
from vjob.cli import main
from vjob.config import ProvisioningConfig
from vjob.errors import InputError, VjobError
from vjob.model import Job
from vjob.store import jobs
from vjob.store.db import Store, now
from vjob.store.schema import VMRecord


def qcow2(path: Path, size: str = "16M") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), size], check=True, timeout=30)
    return path


# -- the tree (pure) ----------------------------------------------------------------------------
def test_tree_is_a_balanced_binary_tree_in_heap_order() -> None:
    tree = distribution.Tree.build("head", [f"n{i}" for i in range(1, 7)])
    assert tree.nodes == ("head", "n1", "n2", "n3", "n4", "n5", "n6")
    assert tree.children("head") == ("n1", "n2")
    assert tree.children("n1") == ("n3", "n4")
    assert tree.children("n3") == ()
    assert tree.path("n3", "n5") == ["n3", "n1", "head", "n2", "n5"]
    assert tree.distance("n3", "n4") == 2
    with pytest.raises(InputError, match="node 'zz' is not in the distribution tree"):
        tree.index("zz")


def test_from_the_head_alone_copies_double_every_round() -> None:
    tree = distribution.Tree.build("head", [f"n{i}" for i in range(1, 8)])
    plan = distribution.plan("img", tree, [], [f"n{i}" for i in range(1, 8)])
    assert plan.rounds == 3  # 1, then 2, then 4 senders
    assert [len(ts) for _r, ts in sorted(plan.by_round().items())] == [1, 2, 4]
    first = plan.by_round()[1][0]
    assert (first.source, first.target) == ("head", "n1")  # the head's nearest node relays first


def test_a_request_is_served_by_the_nearest_holder_not_the_head() -> None:
    tree = distribution.Tree.build("head", [f"n{i}" for i in range(1, 15)])
    # n7 and n8 are children of n3; n3 holds the image already.
    plan = distribution.plan("img", tree, ["n3"], ["n7", "n3"])
    assert plan.already == ("n3",)
    assert [(t.source, t.target, t.route) for t in plan.transfers] == [("n3", "n7", ("n3", "n7"))]
    assert distribution.nearest_holder(tree, ["n3"], "n8") == "n3"
    assert distribution.nearest_holder(tree, ["n3"], "n2") == "head"


def test_routing_tables_remember_the_way_to_each_holder() -> None:
    tree = distribution.Tree.build("head", [f"n{i}" for i in range(1, 8)])
    tables = distribution.routing_tables(tree, {"head": None, "n3": "head", "n4": "n3"})
    assert tables == {"head": {"n3": "n1"}, "n1": {"n3": "n3", "n4": "n4"}, "n3": {"n4": "n1"}}


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(min_value=1, max_value=40),
    data=st.data(),
)
def test_plans_are_feasible_and_logarithmic(size: int, data: st.DataObject) -> None:
    names = [f"n{i:02d}" for i in range(1, size + 1)]
    tree = distribution.Tree.build("head", names)
    holders = data.draw(st.sets(st.sampled_from(names), max_size=size))
    targets = data.draw(st.sets(st.sampled_from(names), min_size=1))
    plan = distribution.plan("img", tree, holders, targets)
    have = {"head", *holders}
    for _rnd, transfers in sorted(plan.by_round().items()):
        senders = [t.source for t in transfers]
        assert len(senders) == len(set(senders)), "a node sends twice in one round"
        assert all(t.source in have for t in transfers), "a source did not hold the image yet"
        assert all(t.route[0] == t.source and t.route[-1] == t.target for t in transfers)
        have |= {t.target for t in transfers}
    received = [t.target for t in plan.transfers]
    assert sorted(received) == sorted(set(targets) - {"head", *holders})
    assert set(plan.already) == set(targets) & {"head", *holders}
    missing = len(received)
    start = len({"head", *holders})
    # Senders at least double each round: never more rounds than doubling from `start` needs.
    assert plan.rounds <= max(0, math.ceil(math.log2((start + missing) / start)))


# -- the catalogue (store) ---------------------------------------------------------------------
@pytest.fixture
def catalogue(tmp_path: Path, store: Store) -> Catalogue:
    cfg = ProvisioningConfig(
        nodes={f"n{i}": "test:///default" for i in range(1, 5)}, image_dir=str(tmp_path / "img" / "{node}")
    )
    return Catalogue(store, cfg, data_dir=tmp_path)


def test_add_list_distribute_verify_remove(tmp_path: Path, catalogue: Catalogue, store: Store) -> None:
    src = qcow2(tmp_path / "src" / "debian.qcow2")
    info = catalogue.add("debian12", src, version="2024.1")
    assert info.format == "qcow2" and info.holders == {"head": None}
    assert Path(info.path) == tmp_path / "img" / "head" / "debian12-2024.1.qcow2"
    with pytest.raises(InputError, match="already in the catalogue"):
        catalogue.add("debian12", src, version="2024.1")

    seen: list[tuple[int, str, str]] = []
    plan = catalogue.distribute(
        "debian12", ["n1", "n2", "n3", "n4"], on_transfer=lambda t, _files: seen.append((t.round, t.source, t.target))
    )
    assert plan.rounds == 3 and len(seen) == 4
    for node in ("n1", "n2", "n3", "n4"):
        assert (tmp_path / "img" / node / "debian12-2024.1.qcow2").read_bytes() == src.read_bytes()
    holders = catalogue.get("debian12").holders
    assert holders["n1"] == "head" and set(holders) == {"head", "n1", "n2", "n3", "n4"}
    assert catalogue.nodes_with("debian12") == ["head", "n1", "n2", "n3", "n4"]
    assert catalogue.images_by_node() == {n: ["debian12"] for n in ("head", "n1", "n2", "n3", "n4")}
    assert catalogue.plan("debian12", ["n3"]).transfers == ()  # the next request finds it there
    assert catalogue.verify() == []

    with open(tmp_path / "img" / "n3" / "debian12-2024.1.qcow2", "r+b") as fh:
        fh.seek(100)
        fh.write(b"\x01\x02")
    assert [p.split(":")[0] for p in catalogue.verify("debian12")] == ["image debian12 2024.1 on node n3"]
    assert "disk sha256" in catalogue.verify("debian12")[0]

    job_id = jobs.track(store, Job(id="7", user="bob"))
    with store.session() as s:
        s.add(VMRecord(name="vm7", job_id=job_id, image="debian12", created_at=now(), updated_at=now()))
    with pytest.raises(VjobError, match="used by VM"):
        catalogue.remove("debian12")
    with store.session() as s:
        s.query(VMRecord).delete()
    (done,) = catalogue.remove("debian12")
    assert done.nodes == ["n1", "n2", "n3", "n4"] and done.left == {}
    assert catalogue.list() == [] and not Path(info.path).exists()
    for node in ("head", "n1", "n2", "n3", "n4"):  # every holder's copy and index, not the head's alone
        assert sorted(p.name for p in (tmp_path / "img" / node).iterdir()) == [], node
    assert catalogue.images_by_node() == {}


def test_remove_keeps_another_versions_index_and_a_holder_it_cannot_reach(tmp_path: Path, catalogue: Catalogue) -> None:
    catalogue.add("deb", qcow2(tmp_path / "src" / "a.qcow2"), version="1")
    catalogue.distribute("deb", ["n1", "n2"])
    catalogue.add("deb", qcow2(tmp_path / "src" / "b.qcow2", "8M"), version="2")
    catalogue.distribute("deb", ["n1"], version="2")  # n1's index now names version 2
    n2 = tmp_path / "img" / "n2"
    n2.rename(tmp_path / "n2-away")
    n2.write_text("not a directory: n2's copy cannot be reached")
    with pytest.raises(VjobError, match=r"deb 1 on n2: .*Not a directory.*run the same command again"):
        catalogue.remove("deb", version="1")
    kept = catalogue.get("deb", "1")
    assert set(kept.holders) == {"head", "n2"} and Path(kept.path).exists()  # n1 done and forgotten
    n1 = sorted(p.name for p in (tmp_path / "img" / "n1").iterdir())
    assert n1 == ["deb-2.qcow2", "deb.image.json"]  # version 2 and its index stay
    assert json.loads((tmp_path / "img" / "n1" / "deb.image.json").read_text())["version"] == "2"
    (done,) = catalogue.remove("deb", version="1", force=True)
    assert done.nodes == [] and list(done.left) == ["n2"] and f"stays in {n2}" in done.left["n2"]
    assert [i.version for i in catalogue.list()] == ["2"] and not Path(kept.path).exists()


def test_a_failed_copy_fails_only_what_depends_on_it(tmp_path: Path, catalogue: Catalogue) -> None:
    catalogue.add("debian12", qcow2(tmp_path / "src" / "d.qcow2"))
    (tmp_path / "img").mkdir(exist_ok=True)
    (tmp_path / "img" / "n1").write_text("a file where n1's image directory should be")
    with pytest.raises(VjobError, match="copy head -> n1"):
        catalogue.distribute("debian12", ["n1", "n2", "n3", "n4"])
    # n3 and n4 were to receive it from n1 (round 2/3); n2 from the head still got it.
    holders = catalogue.get("debian12").holders
    assert "n1" not in holders and "n2" in holders
    assert catalogue.plan("debian12", ["n1"]).transfers[0].source in ("head", "n2")


def test_bad_images_are_refused_with_the_field(tmp_path: Path, catalogue: Catalogue) -> None:
    with pytest.raises(InputError, match="no such file"):
        catalogue.add("x", tmp_path / "nope.qcow2")
    with pytest.raises(InputError, match="image name 'bad name'"):
        catalogue.add("bad name", qcow2(tmp_path / "a.qcow2"))
    with pytest.raises(InputError, match="version 'v 1'"):
        catalogue.add("ok", qcow2(tmp_path / "a.qcow2"), version="v 1")
    with pytest.raises(InputError, match="not in the catalogue"):
        catalogue.plan("ghost", ["n1"])


# -- the commands --------------------------------------------------------------------------------
@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    n1 = make_test_node(tmp_path / "nodes", "n1")
    path = tmp_path / "vjob.toml"
    path.write_text(
        f'data_dir = "{tmp_path / "data"}"\n[provisioning]\nimage_dir = "{tmp_path / "img" / "{node}"}"\n'
        f'snapshot_dir = "{tmp_path / "snap"}"\n[provisioning.nodes]\nn1 = "{n1}"\nn2 = "test:///default"\n'
        'n3 = "test:///default"\n'
    )
    assert main(["--config", str(path), "db", "upgrade"]) == 0
    return path


def test_image_commands(tmp_path: Path, config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = ["--config", str(config_file)]
    src = qcow2(tmp_path / "src.qcow2")
    assert main([*cfg, "image", "add", "centos", "--file", str(src), "--version", "7"]) == 0
    capsys.readouterr()
    assert main([*cfg, "image", "distribute", "centos", "--nodes", "n1,n2,n3", "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["tree"] == ["head", "n1", "n2", "n3"]
    assert [[(t["source"], t["target"]) for t in r] for r in plan["rounds"]] == [
        [("head", "n1")],
        [("head", "n2"), ("n1", "n3")],
    ]
    assert not (tmp_path / "img" / "n1").exists()  # a dry run copies nothing
    assert main([*cfg, "image", "distribute", "centos", "--nodes", "n1,n2,n3"]) == 0
    out = capsys.readouterr().out
    assert "round 2: n1 -> n3" in out and "routing table of n1: n3 via n3" in out
    assert main([*cfg, "image", "list", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["holders"] == {"head": None, "n1": "head", "n2": "head", "n3": "n1"}
    assert main([*cfg, "image", "verify"]) == 0
    assert main([*cfg, "image", "remove", "centos"]) == 0
    assert main([*cfg, "image", "add", "bad/name", "--file", str(src)]) == 2
    assert "image name 'bad/name'" in capsys.readouterr().err


def test_vm_commands_on_test_nodes(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = ["--config", str(config_file)]
    assert main([*cfg, "vm", "list", "--node", "n2", "--json"]) == 0
    (vm,) = json.loads(capsys.readouterr().out)  # test:///default holds one running domain, "test"
    assert (vm["name"], vm["state"], vm["node"]) == ("test", "running", "n2")
    assert main([*cfg, "vm", "list", "--node", "n2"]) == 0
    lines = capsys.readouterr().out.splitlines()  # not a terminal: plain aligned columns, full headers
    assert lines[1].split() == ["node", "VM", "state", "memory", "vCPUs", "persistent"]
    assert lines[2].split()[:3] == ["n2", "test", "running"] and lines[2].index("test") == lines[1].index("VM")
    assert main([*cfg, "vm", "save", "test", "--node", "n2"]) == 0
    assert "VM test saved on n2" in capsys.readouterr().out
    assert main([*cfg, "vm", "destroy", "ghost", "--node", "n1"]) == 0  # idempotent: nothing to do
    assert main([*cfg, "vm", "migrate", "ghost", "--from", "n1", "--to", "n2"]) == 1
    assert "migrate of VM ghost on node n1: no such domain" in capsys.readouterr().err
    assert main([*cfg, "vm", "save", "x;y", "--node", "n1"]) == 2


def test_a_bootable_image_reaches_each_node_whole_and_is_repaired_file_by_file(
    tmp_path: Path, catalogue: Catalogue
) -> None:
    """Shared-filesystem nodes (local copies): the kernel, initrd and index travel with the disk;
    a damaged kernel is found by verify, withdrawn from the pilots and re-copied alone."""
    (tmp_path / "k").write_bytes(b"kernel" * 1000)
    (tmp_path / "i").write_bytes(b"initrd" * 1000)
    info = catalogue.add_or_reuse(
        "deb", qcow2(tmp_path / "src" / "d.qcow2"), kernel=tmp_path / "k", initrd=tmp_path / "i", cmdline="ro"
    )
    seen: dict[str, list[str]] = {}
    catalogue.distribute("deb", ["n1", "n2"], on_transfer=lambda t, files: seen.update({t.target: files}))
    assert seen == {n: ["disk", "kernel", "initrd", "index"] for n in ("n1", "n2")}
    local = images.local_image(catalogue.config, tmp_path, "n2", "deb")
    assert local is not None and local.kernel is not None and local.kernel.read_bytes() == b"kernel" * 1000
    assert local.path.parent == tmp_path / "img" / "n2" and local.cmdline == "ro"
    assert catalogue.verify() == []

    local.kernel.write_bytes(b"other!" * 1000)  # same size, other bytes
    now_, recorded = (hashlib.sha256(b * 1000).hexdigest()[:12] for b in (b"other!", b"kernel"))
    assert catalogue.verify() == [f"image deb {info.version} on node n2: kernel sha256 {now_}…, {recorded}… recorded"]
    assert catalogue.node_states(catalogue.get("deb"), hashed=False)["n2"]["kernel"] == "ok"  # list: sizes only
    seen.clear()
    catalogue.distribute("deb", ["n1", "n2"], on_transfer=lambda t, files: seen.update({t.target: files}))
    assert seen == {"n1": [], "n2": ["kernel", "index"]}
    assert catalogue.verify() == [] and local.kernel.read_bytes() == b"kernel" * 1000
    assert not [p for p in (tmp_path / "img" / "n2").iterdir() if p.name.startswith(".")]
