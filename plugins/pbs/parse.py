"""`parse_output(kind, text, source=...)`: any recorded Torque, OpenPBS or Moab output → model.

Why the format is detected rather than given: an operator debugging the adapter pastes
whatever their site prints (`qstat -x`, `qstat -f`, `qstat -f -F json`, `pbsnodes -x`,
`pbsnodes -a`, `pbsnodes -av -F json`, Moab `showq`/`checknode`) into `vjob rms parse --rms
pbs`; each of these starts in a way no other does (records.detect).
"""

from __future__ import annotations

import time

from plugins.pbs import convert, records
from plugins.pbs.convert import Conventions
from vjob.errors import InputError
from vjob.model import Job, Node

JOB_FORMATS = {"torque-xml-jobs", "pbs-text-jobs", "moab-showq"}
NODE_FORMATS = {"torque-xml-nodes", "pbs-text-nodes", "moab-checknode", "moab-xml-nodes"}


def parse_jobs(text: str, *, source: str, conventions: Conventions | None = None, year: int | None = None) -> list[Job]:
    """Every job record in `text` (finished ones included: the caller filters)."""
    conventions = conventions or Conventions()
    fmt = records.detect(text)
    if fmt in ("empty", "torque-xml-empty"):
        return []
    if fmt == "torque-xml-jobs":
        recs = records.torque_xml(text, source=source, element="Job")
    elif fmt == "pbs-text-jobs":
        recs = records.pbs_text_jobs(text, source=source)
    elif fmt == "openpbs-json":
        kind, recs = records.openpbs_json(text, source=source)
        if kind != "jobs":
            raise InputError(f"{source}: this is OpenPBS node output (pbsnodes), not job output (qstat)")
    elif fmt == "moab-showq":
        this_year = year or time.localtime().tm_year
        return [convert.moab_job(r, source=source, year=this_year) for r in records.moab_showq(text, source=source)]
    elif fmt in NODE_FORMATS:
        raise InputError(f"{source}: this is node output ({fmt}), not job output; use --kind nodes")
    else:
        raise InputError(f"{source}: not a qstat -x, qstat -f, qstat -f -F json or showq output: {text[:60]!r}")
    return [convert.to_job(r, conventions, source=source) for r in recs]


def parse_nodes(text: str, *, source: str, conventions: Conventions | None = None) -> list[Node]:
    """Every node record in `text`."""
    conventions = conventions or Conventions()
    fmt = records.detect(text)
    if fmt in ("empty", "torque-xml-empty"):
        return []
    if fmt == "torque-xml-nodes":
        return [
            convert.torque_node(r, conventions, source=source)
            for r in records.torque_xml(text, source=source, element="Node")
        ]
    if fmt == "pbs-text-nodes":
        # Torque prints np and properties; OpenPBS's `pbsnodes -av` prints pcpus and resources_available.*
        return [
            convert.torque_node(r, conventions, source=source)
            if "np" in r
            else convert.openpbs_node(r, conventions, source=source)
            for r in records.pbs_text_nodes(text, source=source)
        ]
    if fmt == "openpbs-json":
        kind, recs = records.openpbs_json(text, source=source)
        if kind != "nodes":
            raise InputError(f"{source}: this is OpenPBS job output (qstat), not node output (pbsnodes)")
        return [convert.openpbs_node(r, conventions, source=source) for r in recs]
    if fmt == "moab-checknode":
        return [
            convert.moab_node(r, conventions, source=source) for r in records.moab_checknode_text(text, source=source)
        ]
    if fmt == "moab-xml-nodes":
        return [
            convert.moab_node(r, conventions, source=source) for r in records.moab_checknode_xml(text, source=source)
        ]
    if fmt in JOB_FORMATS:
        raise InputError(f"{source}: this is job output ({fmt}), not node output; use --kind jobs")
    raise InputError(
        f"{source}: not a pbsnodes -x, pbsnodes -a, pbsnodes -av -F json or checknode output: {text[:60]!r}"
    )


def parse_output(kind: str, text: str, *, source: str) -> list[Job] | list[Node]:
    """The entry point of `vjob rms parse --rms pbs`, with the default site conventions."""
    if kind == "jobs":
        return parse_jobs(text, source=source)
    if kind == "nodes":
        return parse_nodes(text, source=source)
    raise InputError(f"kind = {kind!r}: must be jobs or nodes")
