"""vjob's deadline admission rule for OAR: `oarsub -t deadline=DATE` refused when its x-factor
is at or over the X the agent publishes (docs/deadline.md, "Live on OAR").

Why an admission rule: it is OAR's one place to refuse a job at submission, as job_submit.lua is
Slurm's and the queuejob hook PBS's; the three say the same thing in the same words. Why OAR's
own `-t deadline=` type: it is the RMS's field for it (OAR's scheduler already refuses to start
such a job past its deadline), so the user learns nothing new, and OAR's type check accepts it.

The rule (package data `vjob/deploy_files/oar/vjob_deadline_rule.pl`) reads one small local
file — no network inside oarsub, which runs it as uid oar — with the rules of
`preemption.deadline.threshold_file.read_threshold`, and fails open: no file, a malformed,
stale or future-dated one, or any error → no check. It is installed with OAR's
`oaradmissionrules` like the Saline rule (saline_bew.admission, whose install and uninstall it
uses with its own first line), at the same priority: after OAR's default walltime, before its
job-type check.
"""

from __future__ import annotations

import re
from importlib import resources

from preemption.deadline.threshold_file import DEFAULT_STALE_S, MAX_STALE_S
from saline_bew import admission
from vjob.errors import InputError

MARK = "# vjob deadline rule:"
"""The rule's first line starts with this (distinct from the Saline rule's admission.MARK)."""
READ_TIMEOUT_S = 2
"""The rule's alarm around reading the threshold file: oarsub waits for its admission rules, and
a FIFO or a hung mount at that path must cost a submission 2 s at most, then no check."""
_PATH = re.compile(r"/[A-Za-z0-9_./-]{1,1023}")
"""An absolute path of characters safe inside Perl single quotes."""


def template() -> str:
    return resources.files("vjob").joinpath("deploy_files", "oar", "vjob_deadline_rule.pl").read_text()


def render(*, threshold_file: str) -> str:
    """The rule reading `threshold_file` (the agent's `[deadline] threshold_file`), checked:
    the path ends up inside Perl quotes."""
    if not isinstance(threshold_file, str) or not _PATH.fullmatch(threshold_file) or "/../" in f"{threshold_file}/":
        raise InputError(f"threshold_file = {str(threshold_file)[:80]!r}: must be an absolute path of plain characters")
    text = template()
    if not text.startswith(MARK):
        raise InputError(f"the packaged deadline rule does not start with {MARK!r}")
    return (
        text.replace("@THRESHOLD@", threshold_file)
        .replace("@DEFAULT_STALE@", str(DEFAULT_STALE_S))
        .replace("@MAX_STALE@", str(MAX_STALE_S))
        .replace("@READ_TIMEOUT@", str(READ_TIMEOUT_S))
    )


def install(rule: str, command: str = "oaradmissionrules") -> tuple[int, list[int]]:
    """Add the rule, then remove the deadline rules installed before: (new id, replaced ids)."""
    return admission.install(rule, command, mark=MARK)


def installed(command: str = "oaradmissionrules") -> list[int]:
    return admission.installed(command, mark=MARK)


def uninstall(command: str = "oaradmissionrules") -> list[int]:
    return admission.uninstall(command, mark=MARK)
