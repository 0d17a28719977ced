"""`vjob rms parse` (what an adapter reads) and `vjob deploy` (the files an operator installs).

Each adapter package (plugins.slurm, plugins.pbs, plugins.oar) exposes
`parse_output(kind: str, text: str, *, source: str) -> list[Job] | list[Node]`, raising
InputError naming the file and what is wrong. Operators use `vjob rms parse` to debug an
adapter against their own RMS's output; the tests use it on the recorded fixtures. `vjob
deploy` lists and installs the hooks, units and examples shipped in the package (plugins.deploy).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from plugins import RMS_PACKAGES, deploy_manifest, rms_package
from plugins import deploy as deploy_files
from vjob.errors import InputError

RMS_EPILOG = """\
examples:
  vjob rms parse --rms slurm --kind jobs <(squeue --json)
  vjob rms parse --rms pbs --kind nodes <(pbsnodes -av -F json)
  oarstat -J | vjob rms parse --rms oar --kind jobs -"""

DEPLOY_EPILOG = """\
examples:
  vjob deploy list
  vjob deploy install agent-unit slurm-job-submit        # to their usual places (as root)
  vjob deploy install slurm-config --dest /tmp/review     # look before installing
  vjob deploy install all --dest ./vjob-files
  less "$(vjob deploy path alert-rules)"

An existing file with other content is kept (--force replaces it); a destination that is a
symbolic link is refused. Units are rewritten to name the vjob command that installs them."""


def register(sub: Any) -> None:
    _register_rms(sub)
    _register_deploy(sub)


def _register_rms(sub: Any) -> None:
    p = sub.add_parser(
        "rms",
        help="RMS adapter tools: parse a recorded RMS output",
        description="Show what an RMS adapter reads from its resource manager's output.",
        epilog=RMS_EPILOG,
    )
    rsub = p.add_subparsers(dest="rms_command", metavar="ACTION", required=True)
    parse = rsub.add_parser(
        "parse",
        help="print, as JSON, the jobs or nodes an adapter reads from a recorded output",
        description="Parse one recorded command output (squeue/scontrol, qstat/pbsnodes, oarstat/oarnodes) "
        "with the adapter's reader and print the jobs or nodes as JSON; a malformed output is one error line.",
        epilog=RMS_EPILOG,
    )
    parse.add_argument("--rms", required=True, choices=sorted(RMS_PACKAGES), help="the resource manager's dialect")
    parse.add_argument("--kind", required=True, choices=("jobs", "nodes", "partitions"), help="what the output lists")
    parse.add_argument("file", help="recorded command output ('-' for standard input)")
    parse.set_defaults(func=_parse)


def _register_deploy(sub: Any) -> None:
    p = sub.add_parser(
        "deploy",
        help="list and install the files an operator deploys (units, hooks, examples)",
        description="The systemd units, RMS hooks, example configurations, Grafana dashboard and Prometheus "
        "rules shipped in the package (docs/operator.md).",
        epilog=DEPLOY_EPILOG,
    )
    dsub = p.add_subparsers(dest="deploy_command", metavar="ACTION", required=True)
    lst = dsub.add_parser(
        "list",
        help="the installable files: name, usual destination, what it is",
        description="List the files shipped for operators: their names, usual destinations and purpose.",
        epilog=DEPLOY_EPILOG,
    )
    lst.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    lst.set_defaults(func=_deploy_list)
    path = dsub.add_parser(
        "path",
        help="print where the packaged file NAME is (to read or diff it)",
        description="Print the path of the packaged file NAME inside the installed vjob.",
        epilog=DEPLOY_EPILOG,
    )
    path.add_argument("name", metavar="NAME", help="a name from `vjob deploy list`")
    path.set_defaults(func=_deploy_path)
    ins = dsub.add_parser(
        "install",
        help="copy files to their usual places, or into --dest DIR",
        description="Install each NAME (or `all`, with --dest) with its mode; an existing different file is "
        "kept unless --force, a symbolic link at the destination is refused.",
        epilog=DEPLOY_EPILOG,
    )
    ins.add_argument("names", nargs="+", metavar="NAME", help="names from `vjob deploy list`, or all (needs --dest)")
    ins.add_argument("--dest", type=Path, metavar="DIR", help="install into DIR (same file names) instead")
    ins.add_argument(
        "--root",
        type=Path,
        metavar="DIR",
        help="install to the usual places under DIR (a staging root; `vjob uninstall --root DIR` removes them)",
    )
    ins.add_argument("--json", action="store_true", help="print a JSON list (name, path, verdict, mode) instead")
    ins.add_argument("--force", action="store_true", help="replace an existing file whose content differs")
    ins.set_defaults(func=_deploy_install)


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
    from vjob.model import to_plain  # heavy: pydantic

    items = rms_package(args.rms).parse_output(args.kind, text, source=source)
    json.dump([to_plain(x) for x in items], sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _deploy_list(args: argparse.Namespace) -> int:
    entries = deploy_files.CATALOGUE
    if args.json:
        rows = [{"name": e.name, "target": e.target, "mode": f"{e.mode:04o}", "what": e.what} for e in entries]
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(e.name) for e in entries)
    target = max(len(e.target) for e in entries)
    for e in entries:
        print(f"{e.name:<{width}}  {e.target:<{target}}  {e.what}")
    return 0


def _deploy_path(args: argparse.Namespace) -> int:
    entry = deploy_files.find(args.name)
    if entry.source.startswith("generated:"):
        raise InputError(f"deploy file {entry.name!r} is written from this vjob's code at install: no packaged file")
    print(entry.packaged())
    return 0


def _deploy_install(args: argparse.Namespace) -> int:
    if args.root is not None and args.dest is not None:
        raise InputError("vjob deploy install: --root and --dest exclude each other")
    root = args.root.resolve() if args.root is not None else Path("/")
    if args.root is not None:
        args.dest = None
    if "all" in args.names:
        if args.dest is None:
            raise InputError("vjob deploy install all: give --dest DIR (the examples of every RMS share one name)")
        entries = list(deploy_files.CATALOGUE)
    else:
        entries = [deploy_files.find(n) for n in dict.fromkeys(args.names)]
    targets = [deploy_files.destination(e, args.dest) for e in entries]
    clashes = {t for t in targets if targets.count(t) > 1}
    if clashes and args.dest is None:
        raise InputError(f"these names install to the same file {', '.join(map(str, sorted(clashes)))}: give one")
    done: list[dict[str, str]] = []
    for entry in entries:
        if args.dest is not None and targets.count(deploy_files.destination(entry, args.dest)) > 1:
            dest = args.dest / entry.name  # the three example vjob.toml files: one directory each
        else:
            dest = args.dest
        if args.root is not None:
            dest = deploy_manifest.under(root, entry.target).parent
        path, verdict = deploy_files.install(entry, dest, force=args.force)
        if args.dest is None:  # the usual place (or under --root): `vjob uninstall` removes it
            deploy_manifest.record(root, entry.name, path)
        done.append({"name": entry.name, "path": str(path), "verdict": verdict, "mode": f"{entry.mode:04o}"})
        if not args.json:
            print(f"{verdict:<9} {path}  ({entry.name}, mode {entry.mode:04o})")
    if args.json:
        print(json.dumps(done, indent=2))
    return 0
