"""The nodes by a text listing (plugins.slurm.node_listing): the same Nodes as the JSON, on the
real 22.05 recordings; strict lines; the JSON when due or when the listing cannot be trusted;
through the real adapter and the stand-in commands, one sinfo call a tick."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devkit.slurm_standin import SlurmStandIn, node_listing_line
from plugins.slurm import json_stream
from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import SlurmCommands
from plugins.slurm.node_listing import LISTING_ARGS, UNTRUSTED_LIMIT, IncrementalNodes, Listing, Untrusted, node_of
from vjob.model import Node, NodeState

RECORDED = Path(__file__).parent / "data" / "fixtures" / "slurm" / "node-listing-22.05"
SNAPSHOTS = ("1", "2")


def _json_nodes(snapshot: str) -> list[Node]:
    text = (RECORDED / f"{snapshot}-sinfo.json").read_text()
    return json_stream.nodes([text], source="sinfo --json")


def _listing(snapshot: str) -> str:
    return (RECORDED / f"{snapshot}-listing.txt").read_text()


@pytest.mark.parametrize("snapshot", SNAPSHOTS)
def test_the_listing_gives_the_nodes_the_json_gives(snapshot: str) -> None:
    """Recorded at the same moment on the real dev cluster (drained, down, allocated, mixed,
    features, a weight, two partitions so two lines for node1 and node2)."""
    from_json = {n.name: n for n in _json_nodes(snapshot)}
    from_listing = Listing().read(_listing(snapshot))
    assert list(from_listing) == list(from_json) and from_listing == from_json


def test_the_recorded_states_are_what_vjob_reads() -> None:
    nodes = Listing().read(_listing("1"))
    assert nodes["node2"].state is NodeState.DRAINED  # "allocated+drain" here, "mixed" + DRAIN in the JSON
    assert nodes["node3"].state is NodeState.DRAINED and nodes["node4"].state is NodeState.DOWN
    assert nodes["node1"].state is NodeState.ALLOCATED and nodes["node8"].state is NodeState.MIXED
    assert nodes["node6"].features == ("fast", "ssd") and nodes["node7"].weight == 5
    assert Listing().read(_listing("2"))["node6"].features == ("fast",)  # active ones, not available ones


def test_the_stand_in_prints_what_slurm_printed() -> None:
    """devkit's stand-in makes its listing from the JSON: line for line the real one, but the
    drained node with a job on part of its CPUs (real sinfo says allocated, the JSON mixed)."""
    for snapshot in SNAPSHOTS:
        doc = json.loads((RECORDED / f"{snapshot}-sinfo.json").read_text())
        made = [node_listing_line(n) for n in doc["nodes"]]
        real = list(dict.fromkeys(_listing(snapshot).splitlines()))
        differ = [(a, b) for a, b in zip(made, real, strict=True) if a != b]
        assert differ == ([] if snapshot == "2" else [(real[1].replace("allocated", "mixed"), real[1])])


def test_the_arguments_are_those_recorded() -> None:
    assert LISTING_ARGS == (
        "-h",
        "-N",
        "-O",
        "NodeList:0|,CPUs:0|,Memory:0|,StateComplete:0|,features_act:0|,Features:0|,Weight:0",
    )


@pytest.mark.parametrize(
    "line",
    [
        "node1|4|4096|idle|(null)|(null)",  # a field missing (an older sinfo without one of them)
        "node1|4|4096|idle|(null)|(null)|1|extra",  # a field more
        "node1|4|4096|idle|(null)|(null)|1 ",  # a width pad
        "node1|4|4096|weird|(null)|(null)|1",  # a state vjob does not know
        "node1|4|4096|idle*|(null)|(null)|1",  # a compact-form suffix: not StateComplete
        "node1|4|4096|idle|a b|(null)|1",  # a space in a feature
        "node1|4|4096|idle|(null)|(null)|1|drained by job 5: see /tmp",  # a reason-like tail
        "-node|4|4096|idle|(null)|(null)|1",  # not a node name
        "node1|4|4096M|idle|(null)|(null)|1",  # a unit
        "node1|99999999|4096|idle|(null)|(null)|1",
    ],
)
def test_a_line_that_is_not_strictly_a_listing_line_is_untrusted(line: str) -> None:
    with pytest.raises(Untrusted):
        node_of(line)
    with pytest.raises(Untrusted):
        Listing().read(_listing("1") + line + "\n")


def test_a_node_listed_twice_differently_is_untrusted_the_same_line_twice_is_not() -> None:
    text = "node1|4|4096|idle|(null)|(null)|1\nnode1|4|4096|idle|(null)|(null)|1\n"
    assert list(Listing().read(text)) == ["node1"]
    with pytest.raises(Untrusted, match="twice"):
        Listing().read(text + "node1|4|4096|idle+drain|(null)|(null)|1\n")


def test_an_unchanged_line_gives_back_its_node_object() -> None:
    listing = Listing()
    first = listing.read(_listing("1"))
    assert listing.changed == 8
    second = listing.read(_listing("2"))
    assert listing.changed == 6  # node1 to node5 (a job ended, resumed) and node6 (its features)
    assert second["node7"] is first["node7"] and second["node8"] is first["node8"]
    assert second["node1"] is not first["node1"] and second["node1"].state is NodeState.IDLE


class Fake:
    """A listing and a JSON read by hand, counting each: the recordings, or what a test puts."""

    def __init__(self, snapshot: str = "1") -> None:
        self.text = _listing(snapshot)
        self.json = _json_nodes(snapshot)
        self.calls: list[str] = []
        self.whole = False

    def list_nodes(self) -> str:
        self.calls.append("listing")
        return self.text

    def read_all(self) -> list[Node]:
        self.calls.append("json")
        return list(self.json)

    def nodes(self, resync_every: int = 4) -> IncrementalNodes:
        return IncrementalNodes(
            self.list_nodes, self.read_all, resync_every=resync_every, resync_due=lambda: self.whole
        )


def test_json_first_then_the_listing_then_the_json_every_n_ticks_or_with_the_jobs() -> None:
    fake = Fake()
    nodes = fake.nodes(resync_every=4)
    ticks = [nodes.nodes() for _ in range(6)]
    assert fake.calls == ["json", "listing", "listing", "listing", "json", "listing"]
    assert all(t == fake.json for t in ticks)  # the same nodes, in the JSON's order
    fake.calls.clear()
    fake.whole = True  # this tick's jobs were read whole: the nodes too
    nodes.nodes()
    assert fake.calls == ["json"] and nodes.last.full and nodes.last.reason == "resync"


def test_a_change_comes_from_the_listing_in_the_jsons_order() -> None:
    fake = Fake("1")
    nodes = fake.nodes(resync_every=100)
    nodes.nodes()
    fake.text = "".join(reversed(_listing("2").splitlines(keepends=True)))  # sinfo's order is not kept
    seen = nodes.nodes()
    assert [n.name for n in seen] == [n.name for n in fake.json]
    assert seen == _json_nodes("2") and not nodes.last.full
    assert nodes.last.changed == 8  # the first listing after a JSON-only start: every line new


def test_an_untrusted_listing_or_a_node_added_reads_the_json_and_repeated_gives_up() -> None:
    fake = Fake()
    nodes = fake.nodes(resync_every=100)
    nodes.nodes()
    fake.text = _listing("1") + "node9|4|4096|idle|(null)|(null)|1\n"
    fake.calls.clear()
    nodes.nodes()
    assert fake.calls == ["listing", "json"] and nodes.last.reason == "nodes added or gone"
    fake.text = _listing("1").replace("|1\n", "\n")  # an older sinfo: the weight missing
    fake.calls.clear()
    for _ in range(UNTRUSTED_LIMIT):
        assert nodes.nodes() == fake.json
    assert fake.calls == ["listing", "json"] * UNTRUSTED_LIMIT
    fake.calls.clear()
    nodes.nodes()
    assert fake.calls == ["json"] and nodes.last.reason == "listing given up"


def test_through_the_adapter_and_the_stand_in_one_sinfo_call_a_tick(tmp_path: Path) -> None:
    doc = json.loads((RECORDED / "1-sinfo.json").read_text())
    standin = SlurmStandIn(tmp_path / "bin", version="22.05.8", meta=doc["meta"])
    standin.write("sinfo.json", json.dumps(doc, indent=2))
    adapter = SlurmAdapter(SlurmCommands(bin_dir=str(standin.dir)), resync_every=3)
    adapter.version()
    standin.forget_calls()
    ticks = [adapter.nodes() for _ in range(4)]
    sinfo = [c for c in standin.calls() if c[0] == "sinfo"]
    assert [c[1:] for c in sinfo] == [["--json"], list(LISTING_ARGS), list(LISTING_ARGS), ["--json"]]
    assert all(t == ticks[0] for t in ticks) and ticks[0] == _json_nodes("1")


def test_without_observation_by_change_the_json_is_read_every_tick(tmp_path: Path) -> None:
    doc = json.loads((RECORDED / "2-sinfo.json").read_text())
    standin = SlurmStandIn(tmp_path / "bin", version="22.05.8", meta=doc["meta"])
    standin.write("sinfo.json", json.dumps(doc, indent=2))
    adapter = SlurmAdapter(SlurmCommands(bin_dir=str(standin.dir)), resync_every=0)
    assert adapter.node_listing is None
    adapter.nodes()
    adapter.nodes()
    assert [c[1:] for c in standin.calls() if c[0] == "sinfo" and "--version" not in c] == [["--json"]] * 2


def test_the_jsons_node_objects_are_given_back_where_the_listing_says_the_same() -> None:
    """After a resync the listing's first read builds every line anew: an equal Node is the
    JSON's own object, so what the agent derives by identity is not derived again; a node
    that changed is a new object."""
    fake = Fake("1")
    nodes = fake.nodes(resync_every=100)
    whole = {n.name: n for n in nodes.nodes()}
    listed = {n.name: n for n in nodes.nodes()}
    assert all(listed[name] is whole[name] for name in whole)
    fake.text = _listing("2")
    moved = {n.name: n for n in nodes.nodes()}
    assert moved["node7"] is whole["node7"] and moved["node1"] is not whole["node1"]
    fake.json = _json_nodes("2")
    nodes.resync_every = 1  # the JSON again: the listing's objects where equal
    again = {n.name: n for n in nodes.nodes()}
    assert nodes.last.full and all(again[name] is moved[name] for name in moved)
