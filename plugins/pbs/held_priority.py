"""The `Priority` each job holds on a PBS server, read from the same `qstat` output the adapter
parses, so the agent can put back a value a user changed.

Why: on Torque and OpenPBS `Priority` (`qsub -p`, `qalter -p`) is the job owner's to set, and
it is the knob vjob orders the queue with. A user who raises their own job's priority would
pass everyone until vjob sends that job a new value; vjob sends only what changed, so the
override could last the job's whole wait. The agent compares what the server holds with what
it sent and sends its value again where they differ (agent.site_read.resync): a user's
`qalter -p` lasts until the next tick. Values outside −1024..1023 or not integers are left
out (the job then gets vjob's value again, as for one never sent).

With `[pbs] order = "resource"` the order is a custom resource users cannot set
(`Resource_List.vjob_order`): the same read, of that field, only puts back what another
manager or operator changed.
"""

from __future__ import annotations

import re

from plugins.pbs import records
from vjob.errors import InputError

NUMBER = re.compile(r"-?[0-9]{1,10}")
LOW, HIGH = -1024, 1023


def held_priorities(
    text: str, *, source: str, field: str = "Priority", low: int = LOW, high: int = HIGH
) -> dict[str, int]:
    """Job id → its `field` (Priority, or `Resource_List.<name>`) in a `qstat -f`, `qstat -x`
    or `qstat -f -F json` output, where it is an integer in low..high."""
    fmt = records.detect(text)
    if fmt == "pbs-text-jobs":
        recs = records.pbs_text_jobs(text, source=source)
    elif fmt == "torque-xml-jobs":
        recs = records.torque_xml(text, source=source, element="Job")
    elif fmt == "openpbs-json":
        kind, recs = records.openpbs_json(text, source=source)
        if kind != "jobs":
            raise InputError(f"{source}: not job output")
    else:
        return {}
    out: dict[str, int] = {}
    for rec in recs:
        value = str(rec.get(field, "")).strip()
        if NUMBER.fullmatch(value) and low <= int(value) <= high:
            out[str(rec.get("Job_Id", ""))] = int(value)
    return out
