"""Installing vjob's admission rule into OAR, so users keep typing `oarsub`.

Why an admission rule: OAR 2.5 evaluates the Perl rules of its `admission_rules` table inside
every `oarsub` (as uid `oar`); that is the one place where a plain `oarsub -t besteffort
-t vjob=IMAGE COMMAND` can become a Saline vjob without a vjob command. The rule (package data
`vjob/deploy_files/oar/vjob_admission_rule.pl`) sends the submission over the site master's
socket (`op: admit`, with core Perl only: oarsub runs it as uid `oar`, which can run no
program of a root-only Python), the master records the vjob, and the rule rewrites the job
into the holder named after the vjob. It fails open: whatever goes wrong, the job is accepted
as the user wrote it.

The rule is managed with OAR's own `oaradmissionrules` command and found again by its first
line (`MARK`), so installing twice replaces it and uninstalling removes exactly it. Priority
`PRIORITY` places it after OAR's default walltime (rule 15, so the walltime is known) and
before OAR's job-type check (rule 16, which would refuse `vjob=`).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from saline_bew import grammar
from vjob.errors import CommandError, InputError

MARK = "# vjob admission rule:"
"""The rule's first line starts with this; `oaradmissionrules -S` shows first lines."""
PRIORITY = 15
_LISTED = re.compile(r"^--- \((\d+)\) RULE #(\d+)\n(.*)$", re.MULTILINE)
_PATH = re.compile(r"/[A-Za-z0-9_./-]{1,107}")
"""A Unix socket path (at most 108 bytes), of characters safe inside Perl quotes."""
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A default image name: no quote, `@` or `$` can reach the Perl text."""
HOOK_TIMEOUT_S = 10
"""Seconds the rule waits for the site master before accepting the job untouched."""


def template() -> str:
    return resources.files("vjob").joinpath("deploy_files", "oar", "vjob_admission_rule.pl").read_text()


def render(
    *, site: str, socket: str, timeout_s: int = HOOK_TIMEOUT_S, default_image: str = "", allow_opt_out: bool = False
) -> str:
    """The rule for `site`, with every value checked: they end up inside Perl quotes.
    `default_image`: the image every best-effort job naming none gets (the site default);
    `allow_opt_out`: whether `-t vjob=off` then lets a job run bare."""
    grammar.word("site", site, grammar.SITE)
    if default_image and not _IMAGE.fullmatch(default_image):
        raise InputError(f"default image {default_image[:80]!r}: letters, digits, '.', '_' or '-' (at most 64)")
    if not _PATH.fullmatch(socket):
        raise InputError(f"socket = {socket[:80]!r}: must be an absolute path of plain characters")
    if not 1 <= timeout_s <= 60:
        raise InputError(f"timeout = {timeout_s}: between 1 and 60 s (oarsub waits for it)")
    text = template()
    if not text.startswith(MARK):
        raise InputError(f"the packaged rule does not start with {MARK!r}")
    text = text.replace("@DEFAULT_IMAGE@", default_image).replace("@ALLOW_OPT_OUT@", "yes" if allow_opt_out else "no")
    return text.replace("@SOCKET@", socket).replace("@SITE@", site).replace("@TIMEOUT@", str(timeout_s))


def _run(args: list[str], timeout_s: float = 60) -> str:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise CommandError(args, "not found: is OAR's server package installed (oar-server)?") from None
    except subprocess.TimeoutExpired:
        raise CommandError(args, f"no answer after {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        raise CommandError(args, f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:300]}")
    return proc.stdout


def installed(command: str = "oaradmissionrules", *, mark: str = MARK) -> list[int]:
    """Ids of the vjob rules in OAR's admission_rules table (normally zero or one); `mark`:
    the first line of another vjob rule (the deadline rule, saline_bew.deadline_rule)."""
    out = _run([command, "-S"])
    return [int(m.group(2)) for m in _LISTED.finditer(out) if m.group(3).startswith(mark)]


def install(rule: str, command: str = "oaradmissionrules", *, mark: str = MARK) -> tuple[int, list[int]]:
    """Add `rule` (enabled, priority PRIORITY), then remove the vjob rules installed before:
    (new id, replaced ids). Added first, so there is no moment without the rule."""
    before = installed(command, mark=mark)
    fd, tmp = tempfile.mkstemp(prefix="vjob-rule-", suffix=".pl")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(rule)
        os.chmod(tmp, 0o644)  # oaradmissionrules reads it as oar
        _run([command, "-n", "-r", tmp, "-P", str(PRIORITY), "-Y"])
    finally:
        Path(tmp).unlink(missing_ok=True)
    new = [i for i in installed(command, mark=mark) if i not in before]
    if len(new) != 1:
        raise CommandError([command, "-n"], f"the new rule was not found afterwards (rules now: {new})")
    for old in before:
        _run([command, "-d", str(old)])
    return new[0], before


def uninstall(command: str = "oaradmissionrules", *, mark: str = MARK) -> list[int]:
    """Remove every vjob rule; the ids removed (none: nothing was installed)."""
    ids = installed(command, mark=mark)
    for i in ids:
        _run([command, "-d", str(i)])
    return ids
