"""`[pbs]`: which PBS, where its commands are, and the queues and node properties the adapter,
the Torque submit filter and the OpenPBS hook read (composed into the one file by
vjob.config.composed).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from vjob.config import Section

QUEUE_OR_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
"""The names the filter and the hook accept (their NAME)."""
RESOURCE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,62}")
"""A PBS custom resource name (qmgr's: a letter, then letters, digits, underscores)."""


class PbsConfig(Section):
    dialect: Literal["torque", "openpbs"] = "openpbs"
    """Which PBS the agent talks to: Torque (qstat -x XML) or OpenPBS / PBS Pro (-F json)."""
    bin_dir: str = ""
    """Directory of qstat, pbsnodes, qalter, ...; empty means search PATH."""
    torque_format: Literal["xml", "text"] = "xml"
    """Torque only: read `qstat -x`/`pbsnodes -x` (xml) or, for servers without XML, the text forms."""
    interactive_queues: list[str] = Field(default_factory=lambda: ["interactive"])
    """Queues whose jobs are interactive even without `qsub -I`."""
    besteffort_queues: list[str] = Field(default_factory=list)
    """Queues whose jobs are best-effort (preempted first, never preempting)."""
    os_property_prefix: str = "os_"
    """A node property `os_centos7` means the node runs image centos7 (UBIS's VM_os)."""
    os_images: list[str] = Field(default_factory=list)
    """OS images the submit filter and hook accept; empty accepts any well-formed name."""
    filter_budget_s: float = Field(2.0, gt=0, le=60)
    """The submit filter passes the script through unchanged when it needs longer than this."""
    vjob_queues: dict[str, str] = Field(default_factory=dict)
    """Queues whose every batch job runs in a VM, each with its default image, e.g.
    `{workq = "debian12"}`: no `#VJOB` line needed (the Torque wrap filter; the OpenPBS hook
    takes the same from its JSON configuration's `vjob_queues`)."""
    allow_opt_out: bool = False
    """Whether a job of a vjob queue may run bare (`#VJOB off`; on OpenPBS `-v VJOB_OS=off`);
    if not, it is refused at qsub with a message saying so."""
    default_queue: str = ""
    """Torque's default queue (the server's default_queue), for a job that names none: the
    filter runs before the server and cannot know it otherwise."""
    node_max_mib: int = Field(0, ge=0, le=1 << 26)
    """The largest memory (MiB) of the nodes vjobs run on: the Torque submit filter refuses a
    vjob asking more per node, with the numbers (0: no such check; the OpenPBS hook takes
    `node_max_mib` from its JSON configuration). Below the guest's minimum plus
    `[provisioning] vm_overhead_mib` is refused either way (docs/realjobs.md, "Size")."""

    order: Literal["priority", "resource"] = "priority"
    """Where the agent writes vjob's queue order. priority: the job's Priority (`qalter -p`),
    which the job's owner may change too (the agent sets it back at its next tick). resource
    (OpenPBS / PBS Pro only): a custom resource users cannot set (`flag=r`), read by the
    scheduler's job_sort_formula, written with `qalter -l NAME=N` by an operator or manager:
    an order no user can override (docs/pbs.md, "An order users cannot override")."""
    order_resource: str = "vjob_order"
    """The custom resource (type long) the agent writes when order = "resource"."""

    @field_validator("order_resource")
    @classmethod
    def _resource(cls, value: str) -> str:
        if not RESOURCE_NAME.fullmatch(value):
            raise ValueError(f"{value[:80]!r}: a resource name is a letter then up to 62 letters, digits or _")
        return value

    @model_validator(mode="after")
    def _order_needs_openpbs(self) -> PbsConfig:
        if self.order == "resource" and self.dialect != "openpbs":
            raise ValueError(
                'order = "resource" needs dialect = "openpbs" (Torque\'s schedulers have no job_sort_formula)'
            )
        return self

    @field_validator("vjob_queues")
    @classmethod
    def _queues(cls, value: dict[str, str]) -> dict[str, str]:
        for queue, image in value.items():
            if not QUEUE_OR_IMAGE.fullmatch(queue) or not QUEUE_OR_IMAGE.fullmatch(image):
                raise ValueError(f"{queue[:80]!r} = {image[:80]!r}: queue and image are 1-64 letters, digits, . _ + -")
        return value
