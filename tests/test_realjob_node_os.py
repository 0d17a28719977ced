"""Nodes carry their OS (issue 15 item 5): node_images is the one source of a node's image.

The agent records the image of every running vjob VM on its node; the adapters' nodes carry it
as `os_image`, so UBIS's N_availableOS counts live nodes. Before this, a Slurm node never had an
OS and a job naming an image lost on both node terms to the same job naming none.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugins.pbs import PbsAdapter, make_adapter
from plugins.pbs.config import PbsConfig
from plugins.slurm.adapter import SlurmAdapter
from provisioning.images import Catalogue, StoreNodeOS, node_os, record_node_image, with_node_os
from tests.pbs_standins import StandIns
from ubis_priority import compute
from vjob.config import Config, parse
from vjob.errors import InputError
from vjob.model import ClusterView, Job, JobState, Node
from vjob.store.db import Store
from vjob.store.schema import NodeImageRecord

NOW = 1_700_000_000.0


def _config(store: Store, tmp_path: Path) -> Config:
    return parse({"data_dir": str(tmp_path / "data"), "database": {"url": store.url}})


def _catalogue(store: Store, tmp_path: Path, *names: str) -> Catalogue:
    cfg = _config(store, tmp_path)
    cat = Catalogue(store, cfg.provisioning, data_dir=cfg.data_path)
    for name in names:
        disk = tmp_path / f"{name}.raw"
        disk.write_bytes(b"\0" * 65536)
        cat.add(name, disk)
    return cat


def test_the_image_a_node_last_ran_is_its_os(store: Store, tmp_path: Path) -> None:
    _catalogue(store, tmp_path, "debian12", "centos")
    head_only = node_os(store)  # the head received both images at `add`: the newer one is its OS
    assert set(head_only) == {"head"}
    assert record_node_image(store, "n1", "debian12") and node_os(store, ["n1"]) == {"n1": "debian12"}
    assert record_node_image(store, "n1", "centos") and node_os(store, ["n1"]) == {"n1": "centos"}
    with store.session() as s:
        stamps = sorted((r.image_id, r.received_at) for r in s.query(NodeImageRecord).filter_by(node="n1"))
    assert record_node_image(store, "n1", "centos")  # already its OS: nothing written
    with store.session() as s:
        assert sorted((r.image_id, r.received_at) for r in s.query(NodeImageRecord).filter_by(node="n1")) == stamps
    assert record_node_image(store, "n1", "debian12") and node_os(store, ["n1"]) == {"n1": "debian12"}
    # The shipped counter guest is not in the catalogue: the node carries no OS for it.
    assert not record_node_image(store, "n2", "debian-tiny") and "n2" not in node_os(store)


@pytest.mark.parametrize(("node", "image"), [("n1\n", "debian12"), ("../n1", "debian12"), ("n1", "deb ian")])
def test_hostile_names_are_refused(store: Store, tmp_path: Path, node: str, image: str) -> None:
    _catalogue(store, tmp_path, "debian12")
    with pytest.raises(InputError):
        record_node_image(store, node, image)


def _priorities(nodes: list[Node]) -> dict[str, tuple[float, float, float]]:
    """(os_available, free_nodes, priority) of two twins: one names debian12, one no image."""
    jobs = (
        Job(id="img", user="bob", nodes=3, os_image="debian12", submit_time=NOW - 7200),
        Job(id="any", user="bob", nodes=3, submit_time=NOW - 7200),
    )
    prios = compute(ClusterView(now=NOW, jobs=jobs, nodes=tuple(nodes)), parse({}).priority)
    out = {}
    for job in jobs:
        terms = {t.term: t.weighted for t in prios.explain(job.id).terms}
        out[job.id] = (terms["os_available"], terms["free_nodes"], prios.as_dict()[job.id])
    return out


def test_a_job_naming_an_image_gets_the_node_terms_of_one_naming_none_once_nodes_carry_it(
    store: Store, tmp_path: Path
) -> None:
    _catalogue(store, tmp_path, "debian12")
    rms_nodes = [Node(name=f"node{i}", cpus=1, memory_mb=1000) for i in range(1, 9)]  # as Slurm reports them
    before = _priorities(with_node_os(rms_nodes, node_os(store)))
    assert before["img"][0] < before["any"][0] and before["img"][1] < before["any"][1]  # the bug
    for node in rms_nodes:  # what the agent does when it sees a running debian12 vjob there
        record_node_image(store, node.name, "debian12")
    after = _priorities(with_node_os(rms_nodes, node_os(store)))
    assert after["img"] == after["any"]


def test_the_docs_example_from_the_store(store: Store, tmp_path: Path) -> None:
    """docs/priority.md's b1 (0.2825) with the nodes' OS coming from node_images, not the JSON."""
    _catalogue(store, tmp_path, "debian", "centos")
    for i in range(10):
        record_node_image(store, f"n{i}", "debian" if i < 6 else "centos")
    nodes = with_node_os([Node(name=f"n{i}", cpus=8, memory_mb=16384) for i in range(10)], node_os(store))
    jobs = (
        Job(
            id="r1", user="alice", nodes=2, state=JobState.RUNNING, start_time=1699999400, allocated_nodes=("n0", "n1")
        ),
        Job(id="b1", user="bob", nodes=3, os_image="debian", submit_time=1699992800),
    )
    view = ClusterView(now=NOW, jobs=jobs, nodes=tuple(nodes), usage={"alice": 5000, "bob": 100})
    explanation = compute(view, parse({}).priority).explain("b1")
    terms = {t.term: round(t.weighted, 4) for t in explanation.terms}
    assert terms["os_available"] == 0.055 and terms["free_nodes"] == 0.18


def test_the_rms_word_wins_over_the_store() -> None:
    nodes = [Node(name="cn01", cpus=1, memory_mb=1, os_image="rocky9"), Node(name="cn02", cpus=1, memory_mb=1)]
    assert [n.os_image for n in with_node_os(nodes, {"cn01": "debian12", "cn02": "debian12"})] == [
        "rocky9",
        "debian12",
    ]


def test_pbs_nodes_carry_the_stores_os(store: Store, tmp_path: Path) -> None:
    """The PBS adapter (recorded pbsnodes output, stand-in command) with the store's OS."""
    from tests.test_pbs_parse import OPENPBS_NODES

    _catalogue(store, tmp_path, "debian12")
    record_node_image(store, "cn01", "debian12")
    record_node_image(store, "cn02", "debian12")
    standins = StandIns(tmp_path / "bin")
    nodes_file = tmp_path / "pbsnodes.json"
    nodes_file.write_text(json.dumps(OPENPBS_NODES))
    standins.script("pbsnodes", stdout_file=nodes_file)
    cfg = _config(store, tmp_path)
    cfg = cfg.model_copy(update={"pbs": PbsConfig(bin_dir=str(standins.dir))})
    adapter = make_adapter(cfg)
    assert isinstance(adapter, PbsAdapter)
    by_name = {n.name: n.os_image for n in adapter.nodes()}
    assert by_name == {"cn01": "rocky9", "cn02": "debian12", "cn03": ""}  # current_aoe is PBS's own word


@pytest.mark.timeout(120)  # a store that retried forever would hang the adapter: fail instead
def test_a_store_that_fails_gives_no_os_but_the_nodes_still_come(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")  # a database under a regular file can never be created, even by root
    url = f"sqlite:///{blocker / 'x.db'}"
    source = StoreNodeOS(parse({"data_dir": str(tmp_path), "database": {"url": url}}))
    assert source() == {} and source._store is None  # closed, reopened next time
    assert source() == {}


@pytest.mark.slurm
def test_slurm_nodes_carry_the_stores_os(store: Store, tmp_path: Path, slurm_adapter: SlurmAdapter) -> None:
    """The live dev cluster's nodes, with the OS the store records for one of them."""
    _catalogue(store, tmp_path, "debian12")
    live = slurm_adapter.nodes()
    record_node_image(store, live[0].name, "debian12")
    adapter = SlurmAdapter(slurm_adapter.cmd, node_os=lambda: node_os(store))
    carried = {n.name: n.os_image for n in adapter.nodes()}
    assert carried[live[0].name] == "debian12" and all(v == "" for k, v in carried.items() if k != live[0].name)


def test_prio_explain_spells_out_n_available_os(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.test_priority_cli import _view
    from vjob.cli import main

    view_file = tmp_path / "view.json"
    view_file.write_text(json.dumps(_view().to_dict()))
    conf = tmp_path / "vjob.toml"
    conf.write_text("")
    assert main(["--config", str(conf), "prio", "--from", str(view_file), "--explain", "b1"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("os_available"))
    assert "[N_availableOS = 4 free nodes running debian, N_reqOS = 3]" in row
    assert main(["--config", str(conf), "prio", "--from", str(view_file), "--explain", "b1", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["os_image"], data["n_available_os"], data["n_req_os"]) == ("debian", 4, 3)
