"""`parse_output`: recognise which Slurm output a text is and read its jobs, nodes or partitions.

Why recognise rather than ask: operators paste whatever they captured (`squeue --json`,
`scontrol show job`, a site's JSON-lines format); the text itself says what it is, and the
error names what was expected when it is none of them.
"""

from __future__ import annotations

import json
from typing import Any

from plugins.slurm import parse_json, parse_text
from vjob.errors import InputError

KINDS = ("jobs", "nodes", "partitions")


def parse_output(kind: str, text: str, *, source: str = "<slurm output>") -> list[Any]:
    """Jobs, nodes or partitions from one recorded Slurm output (see the module docstring)."""
    if kind not in KINDS:
        raise InputError(f"{source}: kind {kind!r}: must be one of {', '.join(KINDS)}")
    stripped = text.strip()
    if not stripped:
        raise InputError(f"{source}: empty output")
    if stripped.startswith("{"):
        try:
            doc = json.loads(stripped)
        except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
            doc = None
        if isinstance(doc, dict):
            return _from_json(kind, doc, source)
        return _only(
            kind, ("jobs", "nodes"), "JSON lines", source, lambda: parse_text.json_lines(stripped, kind, source=source)
        )
    first = next(line.strip() for line in stripped.splitlines() if line.strip())
    if first.startswith("#") or first.startswith("{"):
        return _only(
            kind, ("jobs", "nodes"), "JSON lines", source, lambda: parse_text.json_lines(stripped, kind, source=source)
        )
    if first.startswith("JobId="):
        return _only(
            kind, ("jobs",), "`scontrol show job`", source, lambda: parse_text.jobs_from_scontrol(text, source=source)
        )
    if first.startswith("NodeName="):
        return _only(
            kind,
            ("nodes",),
            "`scontrol show node`",
            source,
            lambda: parse_text.nodes_from_scontrol(text, source=source),
        )
    if first.startswith("PartitionName="):
        return _only(
            kind,
            ("partitions",),
            "`scontrol show partition`",
            source,
            lambda: parse_text.partitions_from_scontrol(text, source=source),
        )
    if first.startswith("No jobs in the system"):
        return _only(kind, ("jobs",), "`scontrol show job`", source, list)
    raise InputError(
        f"{source}: not a Slurm output vjob reads (line 1 starts {first[:40]!r}); "
        "expected squeue/sinfo/scontrol --json, "
        "`scontrol show job|node|partition` or JSON lines"
    )


def _from_json(kind: str, doc: dict[str, Any], source: str) -> list[Any]:
    if "jobs" in doc:
        return _only(kind, ("jobs",), "squeue --json", source, lambda: parse_json.jobs(doc, source=source))
    if "nodes" in doc or "sinfo" in doc:
        return _only(kind, ("nodes",), "sinfo --json", source, lambda: parse_json.nodes(doc, source=source))
    raise InputError(f"{source}: JSON with neither 'jobs' nor 'nodes'/'sinfo': not squeue/sinfo --json output")


def _only(kind: str, holds: tuple[str, ...], what: str, source: str, read: Any) -> list[Any]:
    if kind not in holds:
        raise InputError(f"{source}: this is {what} output, which holds {' or '.join(holds)}, not {kind}")
    items = read()
    if kind == "nodes":
        return parse_text.merge_nodes(items)
    return list(items)
