"""vjob's size admission rule for OAR: a pilot job (`oarsub ... vjob run ...`) whose hosts cannot
give its VM the guest's minimum is refused at submission, with the numbers (issue 33, item 1).

Why a rule of its own: OAR has no memory request; a job's memory on a host is its cores there
times the site's `memcore` property (plugins/oar/allocation.py), so what can be checked at
submission is the request's fewest cores per host against the largest `memcore` — the rule's
one database read (oarsub's own handle). A job above a host's memory cannot be asked for on OAR
(its cores are the host's at most). Like the deadline rule (saline_bew.deadline_rule) it is
installed with OAR's `oaradmissionrules` through saline_bew.admission with its own first line,
and fails open: no `memcore` property, a request it cannot read, any error → no check.
"""

from __future__ import annotations

from importlib import resources

from saline_bew import admission
from vjob.allocation import GUEST_MIN_MEMORY_MIB
from vjob.errors import InputError

MARK = "# vjob size rule:"
"""The rule's first line starts with this (distinct from the other vjob rules)."""


def template() -> str:
    return resources.files("vjob").joinpath("deploy_files", "oar", "vjob_size_rule.pl").read_text()


def render(*, overhead_mib: int, guest_min_mib: int = GUEST_MIN_MEMORY_MIB) -> str:
    """The rule with the site's `[provisioning] vm_overhead_mib` and the guest's minimum."""
    for name, value in (("overhead_mib", overhead_mib), ("guest_min_mib", guest_min_mib)):
        if not isinstance(value, int) or not 0 <= value <= 1 << 20:
            raise InputError(f"{name} = {str(value)[:40]!r}: a whole number of MiB, 0..{1 << 20}")
    text = template()
    if not text.startswith(MARK):
        raise InputError(f"the packaged size rule does not start with {MARK!r}")
    return text.replace("@OVERHEAD@", str(overhead_mib)).replace("@GUEST_MIN@", str(guest_min_mib))


def install(rule: str, command: str = "oaradmissionrules") -> tuple[int, list[int]]:
    """Add the rule, then remove the size rules installed before: (new id, replaced ids)."""
    return admission.install(rule, command, mark=MARK)


def installed(command: str = "oaradmissionrules") -> list[int]:
    return admission.installed(command, mark=MARK)


def uninstall(command: str = "oaradmissionrules") -> list[int]:
    return admission.uninstall(command, mark=MARK)


__all__ = ["MARK", "install", "installed", "render", "template", "uninstall"]
