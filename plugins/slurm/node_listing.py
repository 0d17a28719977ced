"""Observing Slurm's nodes by a text listing: `sinfo --json` only now and then.

Why: at a site's size `sinfo --json` is 13 MB for 10,000 nodes (1.3 KB a node, most of it
load, memory and times vjob never reads), 0.05 s of the agent's CPU at every tick. What vjob
keeps of a node (vjob.model.Node: name, CPUs, memory, state with its flags, features, weight)
fits in one short line, and every field of it is the administrator's (slurm.conf or
`scontrol update` as root) or slurmctld's own: none is text a user or a job writes. The
node's Reason and Comment, which a site may let a health check or a prolog write from what a
job did, are left out on purpose (vjob does not read them from the JSON either).

Each tick: `sinfo -h -N -O NodeList:0|,CPUs:0|,Memory:0|,StateComplete:0|,features_act:0|,
Features:0|,Weight:0` (LISTING_ARGS; width 0: never cut; one line per node and partition, a node
in two partitions is printed twice, alike), as recorded on the real 22.05 dev cluster
(tests/data/fixtures/slurm/node-listing-22.05). StateComplete is the base state with every
flag ("idle+drain", "mixed"): what the JSON's state and state_flags say, read by the same
states.node_state. A line printed as last time gives back last time's Node; a new line must
match a strict pattern. The listing replaces the JSON, so the RMS calls per tick stay as many.

The JSON (`sinfo --json`, or `scontrol --json show node` on data_parser Slurm) is read whole:
at the first read, on the tick the jobs are read whole (`[slurm] resync_every`, their
resync), and at once when the listing cannot be trusted — a line that does not match, a
node twice with different lines, a state vjob does not know, a node added or gone (the JSON
then also gives slurmctld's order of the nodes, which the listing keeps in between). After
UNTRUSTED_LIMIT untrusted listings in a row (a Slurm whose sinfo lacks a field prints lines
without it) the listing is given up for the JSON at every tick, with a warning.

One difference seen on 22.05, without effect: a drained node with a job on part of its CPUs
is "mixed" + DRAIN in the JSON and "allocated+drain" in the listing; both are DRAINED to vjob.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from plugins.slurm.hostlist import NODE_NAME
from plugins.slurm.states import node_state
from vjob import log
from vjob.errors import InputError
from vjob.model import Node, NodeState

LISTING_FIELDS = ("NodeList", "CPUs", "Memory", "StateComplete", "features_act", "Features", "Weight")
LISTING_ARGS = ("-h", "-N", "-O", ",".join(f"{name}:0|" for name in LISTING_FIELDS[:-1]) + f",{LISTING_FIELDS[-1]}:0")
"""sinfo's arguments: no header, one line per node (and partition), every field uncut."""
UNTRUSTED_LIMIT = 3
"""Untrusted listings in a row after which the JSON is read at every tick instead."""

_FEATURES = r"\(null\)|[A-Za-z0-9_.:=@+-]{1,64}(?:,[A-Za-z0-9_.:=@+-]{1,64}){0,63}"
_LINE = re.compile(
    r"([A-Za-z0-9][A-Za-z0-9._-]{0,63})\|([0-9]{1,7})\|([0-9]{1,12})\|"
    r"([A-Za-z_]{1,32}(?:\+[A-Za-z_]{1,32}){0,15})\|(" + _FEATURES + r")\|(" + _FEATURES + r")\|([0-9]{1,10})"
)
"""One listing line; anything else (a field missing, a width cut, a stray character) is untrusted."""


class Untrusted(InputError):
    """The listing cannot be trusted as a whole: read the JSON."""


def node_of(line: str, *, source: str = "sinfo listing") -> Node:
    """The Node one listing line describes, built as parse_json builds it from the JSON."""
    found = _LINE.fullmatch(line)
    if found is None or not NODE_NAME.fullmatch(found.group(1)):
        raise Untrusted(f"{source}: a line is not a node listing line: {line[:80]!r}")
    name, cpus, memory, state, active, available, weight = found.groups()
    features = active if active != "(null)" else available  # the JSON's rule: active, else available
    try:
        known = _STATES.get(state)
        if known is None:
            known = node_state(state, where=f"{source} (node {name})")
            if len(_STATES) < 256:
                _STATES[state] = known
        return Node(
            name=name,
            cpus=max(1, int(cpus)),
            memory_mb=max(1, int(memory)),
            state=known,
            features=() if features == "(null)" else tuple(f for f in features.split(",") if f),
            weight=int(weight),
        )
    except InputError as exc:
        raise Untrusted(str(exc)) from None


_STATES: dict[str, NodeState] = {}
"""StateComplete text → NodeState, as states.node_state says (a few dozen words at most: the
first listing after a resync reads 10,000 lines)."""


class Listing:
    """The listing read tick after tick: a line printed as last time gives back its Node."""

    def __init__(self) -> None:
        self.built: dict[str, Node] = {}
        """Line → its Node, for the lines of the last read."""
        self.changed = 0
        """Lines of the last read not printed the read before."""

    def read(
        self, text: str, *, source: str = "sinfo listing", kept: Mapping[str, Node] | None = None
    ) -> dict[str, Node]:
        """Name → Node of every node listed, in the listing's order; Untrusted when a line does
        not match, a state is unknown or a node comes twice with different lines. A new line
        whose Node equals `kept`'s gives back `kept`'s object (the JSON's, after a resync):
        what the agent derives from a node by its identity is not derived again."""
        built, before, kept = {}, self.built, kept or {}
        by_name: dict[str, Node] = {}
        changed = 0
        for line in text.split("\n"):
            if not line:
                continue
            node = before.get(line) or built.get(line)
            if node is None:
                node = node_of(line, source=source)
                same = kept.get(node.name)
                node = same if same == node else node
                changed += 1
            built[line] = node
            first = by_name.setdefault(node.name, node)
            if first is not node:  # the same node in another partition: the same line, the same Node
                raise Untrusted(f"{source}: node {node.name} listed twice, differently")
        self.built, self.changed = built, changed
        return by_name


@dataclass
class NodeLook:
    """What one read did (for the tests and a look at a running agent)."""

    full: bool = False
    reason: str = ""
    listed: int = 0
    changed: int = 0


class IncrementalNodes:
    """The nodes Slurm lists, from the listing each tick and the JSON when due (module doc).

    `list_nodes()` runs the listing, `read_all()` reads every node's JSON; `resync_due()` says
    whether this tick's jobs were read whole (the nodes' JSON is read on the same tick)."""

    def __init__(
        self,
        list_nodes: Callable[[], str],
        read_all: Callable[[], Iterable[Node]],
        *,
        resync_every: int,
        resync_due: Callable[[], bool] = lambda: False,
    ) -> None:
        self.list_nodes = list_nodes
        self.read_all = read_all
        self.resync_every = resync_every
        self.resync_due = resync_due
        self.listing = Listing()
        self.order: list[str] | None = None
        """Node names in the last JSON's order (None: never read whole)."""
        self.current: dict[str, Node] = {}
        """Name → the Node last returned: an equal one read again is given back as this object."""
        self.since_full = 0
        self.untrusted = 0
        """Untrusted listings in a row."""
        self.last = NodeLook()

    def nodes(self) -> list[Node]:
        """Every node; the JSON when due or when the listing cannot be trusted."""
        look = NodeLook()
        if self.order is None:
            return self._full(look, "first read")
        if self.untrusted >= UNTRUSTED_LIMIT:
            return self._full(look, "listing given up")
        if self.resync_due() or self.since_full + 1 >= self.resync_every:
            return self._full(look, "resync")
        try:
            found = self.listing.read(self.list_nodes(), kept=self.current)
        except Untrusted as exc:
            self.untrusted += 1
            self.listing = Listing()
            if self.untrusted >= UNTRUSTED_LIMIT:
                log.get("slurm").error("node listing given up: the JSON at every tick", error=str(exc))
            else:
                log.get("slurm").warning("node listing untrusted: JSON read", error=str(exc))
            return self._full(look, "untrusted listing")
        self.untrusted = 0
        look.listed, look.changed = len(found), self.listing.changed
        if len(found) != len(self.order) or any(name not in found for name in self.order):
            return self._full(look, "nodes added or gone")
        self.since_full += 1
        self.last = look
        self.current = found
        return [found[name] for name in self.order]

    def _full(self, look: NodeLook, reason: str) -> list[Node]:
        look.full, look.reason = True, reason
        current = self.current
        nodes = [current[n.name] if current.get(n.name) == n else n for n in self.read_all()]
        self.order = [node.name for node in nodes]
        self.current = {node.name: node for node in nodes}
        self.since_full = 0
        self.last = look
        return nodes


__all__ = ["LISTING_ARGS", "UNTRUSTED_LIMIT", "IncrementalNodes", "Listing", "NodeLook", "Untrusted", "node_of"]
