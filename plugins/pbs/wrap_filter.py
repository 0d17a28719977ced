#!/usr/bin/env python3
"""Torque SUBMITFILTER that also wraps: a plain `qsub job.sh` naming a vjob image runs in a VM.

The Torque counterpart of job_submit.lua's wrapper (docs/slurm-agent.md, transparent
submission). It does everything submit_filter.py does (class derived from `qsub -I` and the
queues, image checked against `[pbs] os_images`, `#PBS -v VJOB_CLASS=…,VJOB_OS=…` tag, fail open
within the time budget), and when the job names an OS image other than the counter guest it
prints instead a small /bin/sh wrapper that keeps the job's directives and runs

    exec vjob run --rms pbs --os NAME --script - --base64 -- "$@"

with the original script, byte for byte, base64 in a quoted here-document whose delimiter
cannot occur in base64: nothing of the user's reaches the shell as code (the image name was
matched whole first). The wrapper changes to `$PBS_O_WORKDIR` first — Torque starts jobs in
$HOME, and the pilot stages the directory it starts in; a directory that is gone fails the job
(exit 2) rather than staging the home — and pins `#PBS -S /bin/sh` (a user's
`-S` line is dropped: Torque would otherwise feed the wrapper to that interpreter; in the
guest the script runs by its own `#!` line).

Why a second program and not a change of submit_filter.py: wrapping changes what runs, so the
operator opts in by installing this one as SUBMITFILTER (deploy/pbs/README.md); a site where
`os=` means PBS's own OS provisioning keeps the tagging filter. Standard library only, like
submit_filter.py, which it imports from its own directory.
"""

from __future__ import annotations

import base64
import os
import sys
from collections.abc import Sequence
from typing import BinaryIO

try:  # installed side by side on the login node (and run as a script from a checkout)
    import submit_filter as base
except ImportError:  # imported as plugins.pbs.wrap_filter (tests, the repository's tools)
    from plugins.pbs import submit_filter as base

COUNTER_IMAGE = "debian-tiny"
"""The counter guest runs no script (`vjob run` in the script itself): never wrapped."""
WRAP_MARK = "# vjob wrapper (submit filter)"
DELIMITER = "VJOB_SCRIPT_END"


def wrap(original: bytes, tagged_header: list[str], image: str) -> bytes:
    """The wrapper: the header's `#PBS` directives (without `-S`), then `exec vjob run`."""
    newline = "\n"
    directives = []
    for line in tagged_header:
        words = line.split()
        if words and words[0] == "#PBS" and not (len(words) > 1 and words[1].startswith("-S")):
            directives.append(line.rstrip("\r\n") + newline)
    encoded = base64.encodebytes(original).decode("ascii")
    text = (
        "#!/bin/sh\n#PBS -S /bin/sh\n"
        + "".join(directives)
        + f"{WRAP_MARK}: the job's own script runs unchanged in a VM of image {image};\n"
        + "# it is below, base64. See docs/realjobs.md.\n"
        + f"#VJOB os={image}\n"
        + 'if [ -n "$PBS_O_WORKDIR" ]; then cd "$PBS_O_WORKDIR" || exit 2; fi\n'
        + f"exec vjob run --rms pbs --os {image} --script - --base64 -- \"$@\" <<'{DELIMITER}'\n"
        + encoded
        + f"{DELIMITER}\n"
    )
    return text.encode("utf-8", errors="surrogateescape")


def wrap_script(data: bytes, argv: Sequence[str], settings: base.Settings, notices: list[str] | None = None) -> bytes:
    """submit_filter's tagged script, or the wrapper when the job names a real image."""
    tagged = base.filter_script(data, argv, settings, notices)  # refuses what it refuses
    lines = base.header_lines(data)
    request, end = base.read_header(lines, argv)
    _, image = base.decide(request, settings)
    if not image or image == COUNTER_IMAGE or request.interactive or not data.strip():
        return tagged
    if any(line.startswith(WRAP_MARK) for line in lines[:end]):
        return tagged  # already wrapped (a qsub of a wrapper): never twice
    tagged_lines = base.header_lines(tagged)
    return wrap(data, tagged_lines[: end + 1], image)


def main(argv: Sequence[str], stdin: BinaryIO, stdout: BinaryIO, stderr: BinaryIO, environ: dict[str, str]) -> int:
    """submit_filter's qsub protocol (budget, refusals, fail open) with wrap_script."""
    return base.main(argv, stdin, stdout, stderr, environ, transform=wrap_script)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], sys.stdin.buffer, sys.stdout.buffer, sys.stderr.buffer, dict(os.environ)))
