"""The VMs' usage as it stands in a job's RMS record: one `vjob-usage@<node>:...` word per node.

Why a word of its own in a free-text field: QEMU runs outside the job's step (docs/multinode.md,
"Accounting"), so the RMS's own counters never see the VMs. Root measures them on each node and
writes them where the site already reads a job's record (Slurm: AdminComment, which only root
and SlurmUser may change; `sacct -o AdminComment` shows it). That field holds other text too —
job_submit.lua's `vjob:class=...,os=...` label, the reason a held-back interactive job waits,
whatever an operator wrote — so a writer changes only its own word and keeps every other
character as it was (vjob.record_text, the one editor of the field).

One word per node, `vjob-usage@node2:cpu_s=812.40,peak_mib=1031,runs=2`, because each node's
root side measures only the VMs on that node and writes on its own: a node rewrites only its
own word, and a multi-node job's total is the sum of its words (`total`). Across the runs of a
requeued or resumed job, a node's CPU seconds are summed and its peak memory is the largest
any run reached (`Usage.add`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from vjob import record_text
from vjob.errors import InputError
from vjob.record_text import MAX_FIELD_CHARS

PREFIX = "vjob-usage@"
MAX_CPU_S = 1e12
MAX_PEAK_MIB = 1 << 40
MAX_RUNS = 1_000_000
_NODE = r"[A-Za-z0-9][A-Za-z0-9.-]{0,62}"
_WORD = re.compile(
    rf"{re.escape(PREFIX)}(?P<node>{_NODE}):cpu_s=(?P<cpu>[0-9]{{1,13}}(?:\.[0-9]{{1,3}})?),"
    r"peak_mib=(?P<peak>[0-9]{1,13}),runs=(?P<runs>[0-9]{1,7})"
)
_NODE_RE = re.compile(_NODE)


@dataclass(frozen=True)
class Usage:
    """What a node's VMs used: CPU seconds (user + system) and the largest resident memory."""

    cpu_s: float = 0.0
    peak_mib: int = 0
    runs: int = 0
    """How many runs of the job (pilots) these figures sum."""

    def __post_init__(self) -> None:
        if not (isinstance(self.cpu_s, int | float) and math.isfinite(self.cpu_s) and 0 <= self.cpu_s <= MAX_CPU_S):
            raise InputError(f"usage cpu_s {self.cpu_s!r}: must be a number in [0, {MAX_CPU_S:g}]")
        if not _whole(self.peak_mib, MAX_PEAK_MIB):
            raise InputError(f"usage peak_mib {self.peak_mib!r}: must be an integer in [0, {MAX_PEAK_MIB}]")
        if not _whole(self.runs, MAX_RUNS):
            raise InputError(f"usage runs {self.runs!r}: must be an integer in [0, {MAX_RUNS}]")

    def add(self, run: Usage) -> Usage:
        """These figures with one more run's: CPU summed, peak the larger, runs counted."""
        return Usage(
            cpu_s=min(MAX_CPU_S, self.cpu_s + run.cpu_s),
            peak_mib=max(self.peak_mib, run.peak_mib),
            runs=min(MAX_RUNS, self.runs + max(run.runs, 1)),
        )


def _whole(value: object, high: int) -> bool:
    """An int (never a bool) in [0, high]."""
    return type(value) is int and 0 <= value <= high


def word(node: str, usage: Usage) -> str:
    """The record word of `node`'s figures."""
    if not _NODE_RE.fullmatch(node):
        raise InputError(f"node {node[:70]!r}: not a node name")
    return f"{PREFIX}{node}:cpu_s={usage.cpu_s:.2f},peak_mib={usage.peak_mib},runs={usage.runs}"


def parse(text: str) -> dict[str, Usage]:
    """Every node's figures in a record's text (words of another shape are not ours: ignored).
    InputError for a text too long to be a record, or a node named twice (it was tampered with)."""
    if len(text) > MAX_FIELD_CHARS:
        raise InputError(f"usage record: {len(text)} characters, more than {MAX_FIELD_CHARS}")
    found: dict[str, Usage] = {}
    for item in text.split():
        match = _WORD.fullmatch(item)
        if match is None:
            continue
        node = match["node"]
        if node in found:
            raise InputError(f"usage record: node {node!r} has two words")
        found[node] = Usage(float(match["cpu"]), int(match["peak"]), int(match["runs"]))
    return found


def merged(text: str, node: str, run: Usage) -> str:
    """`text` with `node`'s word replaced by its figures plus `run`'s (added as the last word
    when it had none, malformed leftovers of it removed); every other character of `text`
    kept as it was (vjob.record_text.put, the one editor of the field)."""
    before = parse(text).get(node, Usage())
    own = re.compile(rf"(?<!\S){re.escape(PREFIX + node)}:\S*")
    return record_text.put(text, own, word(node, before.add(run)))


def total(text: str) -> Usage:
    """A multi-node job's figures: CPU seconds summed over its nodes, the peak the largest
    node's (each VM's peak is its own node's memory), runs the most any node counted."""
    nodes = parse(text).values()
    return Usage(
        cpu_s=min(MAX_CPU_S, sum(u.cpu_s for u in nodes)),
        peak_mib=max((u.peak_mib for u in nodes), default=0),
        runs=max((u.runs for u in nodes), default=0),
    )
