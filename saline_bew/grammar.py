"""What a Saline vjob's fields may hold, checked wherever they come from.

Why a module of its own: the manager runs as root and the shared store it reads is reachable
by every site master, and historically by every user of the CLI. A key read back from the
store becomes a directory in the repository, a VM name and an OAR job name; a label becomes a
file name; a host picks a libvirt node. So every value is checked against its grammar
(`re.fullmatch`: `$` would accept a trailing newline) before the manager acts on it, and a row
that fails is refused with a logged error, never acted on.
"""

from __future__ import annotations

import re
from typing import Any

from plugins.oar.client import JOB_ID as OAR_JOB_ID
from plugins.oar.client import USER, WALLTIME
from saline_bew.events import Phase
from vjob.errors import InputError

KEY = re.compile(r"be[0-9a-f]{10}")
"""`be` + 10 hex digits, as `submission.create` makes them: a safe path component and OAR name."""
LABEL = re.compile(r"s[0-9]{1,20}")
"""A snapshot label: `s` + the milliseconds it was taken at."""
SITE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
IMAGE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,252}")
PLAIN_PATH = re.compile(r"/[A-Za-z0-9_./-]{1,1000}")
"""A path the holder's OAR command may carry (the admission rule checks the same in Perl)."""
PHASES = tuple(Phase)
MAX_WORDS = 256
MAX_WORD = 4096
MAX_COMMAND = 64 * 1024
MAX_VMS = 254
MAX_VCPUS = 256
MAX_MEMORY_MB = 1024 * 1024


def short(value: Any) -> str:
    """repr() of a value for an error message, truncated: hostile values can be huge."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def word(field: str, value: Any, grammar: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not grammar.fullmatch(value):
        raise InputError(f"{field} = {short(value)}: does not match {grammar.pattern}")
    return value


def number(field: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(f"{field} = {short(value)}: must be an integer in {low}..{high}")
    return value


def command(value: Any) -> list[str]:
    """COMMAND runs inside the guest (never a host shell), but it is still bounded in size."""
    if not isinstance(value, (list, tuple)) or not value:
        raise InputError(f"command = {short(value)}: must be a non-empty list of words")
    if len(value) > MAX_WORDS:
        raise InputError(f"command: {len(value)} words, at most {MAX_WORDS}")
    for i, w in enumerate(value):
        if not isinstance(w, str) or len(w) > MAX_WORD or "\0" in w:
            raise InputError(f"command[{i}] = {short(w)}: must be a string of at most {MAX_WORD} characters")
    if sum(len(w) for w in value) > MAX_COMMAND:
        raise InputError(f"command: more than {MAX_COMMAND} characters in all")
    return list(value)


def check_job(job: Any) -> None:
    """Every field of a `saline_bew.journal.SalineJob` the manager uses for a path, a name or
    a command; an InputError names the first field that is wrong."""
    word("key", job.key, KEY)
    word("user", job.user, USER)
    word("image", job.image, IMAGE)
    command(job.command)
    number("vm_count", job.vm_count, 1, MAX_VMS)
    number("vcpus", job.vcpus, 1, MAX_VCPUS)
    number("memory_mb", job.memory_mb, 1, MAX_MEMORY_MB)
    word("walltime", job.walltime, WALLTIME)
    word("home_site", job.home_site, SITE)
    word("site", job.site, SITE)
    if job.oar_job_id is not None:
        word("oar_job_id", job.oar_job_id, OAR_JOB_ID)
    if job.phase not in PHASES:
        raise InputError(f"phase = {short(job.phase)}: not one of {', '.join(PHASES)}")
    if len(job.hosts) > MAX_VMS:
        raise InputError(f"hosts: {len(job.hosts)} hosts, at most {MAX_VMS}")
    for i, host in enumerate(job.hosts):
        word(f"hosts[{i}]", host, HOST)
    if job.hosts and len(job.hosts) != job.vm_count:
        raise InputError(f"hosts: {len(job.hosts)} hosts for {job.vm_count} VMs")
    if job.snapshot_label is not None:
        word("snapshot_label", job.snapshot_label, LABEL)
    if job.snapshot_site is not None:
        word("snapshot_site", job.snapshot_site, SITE)
