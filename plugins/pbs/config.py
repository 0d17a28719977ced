"""`[pbs]`: which PBS, where its commands are, and the queues and node properties the adapter,
the Torque submit filter and the OpenPBS hook read (composed into the one file by
vjob.config.composed).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vjob.config import Section


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
