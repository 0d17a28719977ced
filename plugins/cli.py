"""`vjob rms parse --rms slurm|pbs|oar --kind jobs|nodes FILE`: what an adapter reads.

Each adapter package (plugins.slurm, plugins.pbs, plugins.oar) exposes
`parse_output(kind: str, text: str, *, source: str) -> list[Job] | list[Node]`, raising
InputError naming the file and what is wrong. Operators use this to debug an adapter against
their own RMS's output; the tests use it on the recorded fixtures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from plugins import RMS_PACKAGES, rms_package
from vjob.errors import InputError
from vjob.model import to_plain


def register(sub: Any) -> None:
    p = sub.add_parser("rms", help="RMS adapter tools")
    rsub = p.add_subparsers(dest="rms_command", metavar="ACTION", required=True)
    parse = rsub.add_parser("parse", help="print, as JSON, the jobs or nodes an adapter reads from a recorded output")
    parse.add_argument("--rms", required=True, choices=sorted(RMS_PACKAGES))
    parse.add_argument("--kind", required=True, choices=("jobs", "nodes", "partitions"))
    parse.add_argument("file", help="recorded command output ('-' for standard input)")
    parse.set_defaults(func=_parse)


def _parse(args: argparse.Namespace) -> int:
    if args.file == "-":
        text, source = sys.stdin.read(), "<stdin>"
    else:
        path = Path(args.file)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise InputError(f"{path}: cannot read: {exc.strerror}") from None
        source = str(path)
    items = rms_package(args.rms).parse_output(args.kind, text, source=source)
    json.dump([to_plain(x) for x in items], sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
