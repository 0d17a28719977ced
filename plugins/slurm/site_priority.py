"""The site's own priority of Slurm's pending jobs, for vjob's tier bands (preemption.scheduling.site_order).

Why these two reads: the multifactor sum Slurm holds for a job is the site's weighted
factors (age, fair share, job size, partition, QOS, TRES) plus vjob's site factor, added
unweighted. `sprio` prints both, so the site's own part is PRIORITY − SITE, whatever vjob
sent before. The most the site's factors can give a job is the sum of the PriorityWeight*
values (each factor is normalised to 0..1), which `scontrol show config` prints; it sets how
wide vjob's tier bands must be so that no fair share crosses a tier. Read once a minute: a
`scontrol reconfigure` with new weights is seen within that.

What the span leaves out, on purpose: a job's nice value (a user's positive nice lowers
their own job; an admin's negative nice lifts a job and may cross a tier, as the admin meant)
and PriorityWeightAssoc's association priorities beyond 1 (none on Slurm 22.05).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping

from plugins.slurm.commands import SlurmCommands
from preemption.scheduling.site_order import SiteOrder, needed_range
from vjob.errors import CommandError, InputError

WEIGHT_LINE = re.compile(r"^(PriorityWeight[A-Za-z]{2,16})\s*=\s*(.{0,400})$")
NUMBER = re.compile(r"[0-9]{1,12}")
TRES_ITEM = re.compile(r"[A-Za-z][A-Za-z0-9/:_.-]{0,63}=([0-9]{1,12}(\.[0-9]{1,12})?)")
SPAN_READ_EVERY_S = 60.0


def weight_span(config_text: str) -> int:
    """The sum of the PriorityWeight* lines of `scontrol show config`: a site's largest own
    priority. `PriorityWeightTRES = CPU=1000,Mem=2000` counts each TRES; `(null)` counts 0.
    Refused when a line is neither (a layout vjob does not know must not set its bands)."""
    total = 0
    for line in config_text.splitlines():
        match = WEIGHT_LINE.match(line.strip())
        if not match:
            continue
        name, value = match.group(1), match.group(2).strip()
        if NUMBER.fullmatch(value):
            total += int(value)
        elif value in ("(null)", ""):
            continue
        elif name == "PriorityWeightTRES" and all(TRES_ITEM.fullmatch(item) for item in value.split(",")):
            total += sum(round(float(TRES_ITEM.fullmatch(item).group(1))) for item in value.split(","))  # type: ignore[union-attr]
        else:
            raise CommandError(["scontrol", "show", "config"], f"{name} = {value[:60]!r}: not a weight vjob reads")
    return total


class SiteReader:
    """The span (cached `SPAN_READ_EVERY_S`) and the pending jobs' own priorities of one Slurm."""

    def __init__(self, commands: SlurmCommands, site_factor_max: int, share: float) -> None:
        self.cmd = commands
        self.site_factor_max = site_factor_max
        self.share = share
        self._span: int | None = None
        self._read_at = -SPAN_READ_EVERY_S

    def span(self) -> int:
        """The site's span, checked against `[slurm] site_factor_max`: the bands must fit."""
        now = time.monotonic()
        if self._span is None or now - self._read_at >= SPAN_READ_EVERY_S:
            span = weight_span(self.cmd.run("scontrol", ["show", "config"]))
            need = needed_range(span, self.share)
            if need > self.site_factor_max:
                raise InputError(
                    f"[slurm] order_share = {self.share}: with the site's PriorityWeight* summing to {span},"
                    f" vjob's tier bands need a site factor of up to {need}, above [slurm] site_factor_max ="
                    f" {self.site_factor_max}: raise site_factor_max or lower order_share"
                )
            self._span, self._read_at = span, now
        return self._span

    def order(self, own: Mapping[str, int]) -> SiteOrder:
        """The SiteOrder of the own priorities `own` (plugins.slurm.sprio_lines.SprioLines.read)."""
        return SiteOrder(own=own, span=self.span())
