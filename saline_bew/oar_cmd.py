"""`vjob oar install-rules|uninstall-rules`: put vjob's admission rule into OAR, or take it out.

Why a command: the rule names this installation's Python, the site it belongs to and the
manager's socket, so it is rendered here from the configuration rather than copied by hand
(saline_bew.admission explains the rule and why it fails open).
"""

from __future__ import annotations

import argparse
from typing import Any

from saline_bew import admission, deadline_rule, server
from vjob.cli import load_config
from vjob.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "oar",
        help="OAR integration: the admission rule that turns oarsub -t besteffort -t vjob=IMAGE into a Saline vjob",
        description="Install or remove vjob's admission rule in OAR's admission_rules table (run as root on the "
        "OAR server).",
        epilog="example: vjob oar install-rules --site nancy",
    )
    osub = p.add_subparsers(dest="oar_command", metavar="ACTION", required=True)
    i = osub.add_parser(
        "install-rules",
        help="install (or replace) the vjob admission rule",
        description="Render the vjob admission rule for one site and install it with oaradmissionrules "
        f"(priority {admission.PRIORITY}); an earlier vjob rule is replaced. Users then submit best-effort "
        "vjobs with oarsub -t besteffort -t vjob=IMAGE [-t vjob_vms=N] COMMAND.",
        epilog="example: vjob oar install-rules --site nancy --socket /run/vjob/saline.sock",
    )
    i.add_argument("--site", default=None, help="the Saline site this OAR serves (default: the only configured site)")
    i.add_argument(
        "--socket", default=None, help="the manager's socket path the rule's hook calls (default saline.socket)"
    )
    i.add_argument(
        "--timeout",
        type=int,
        default=admission.HOOK_TIMEOUT_S,
        help="seconds oarsub waits for the site master before accepting the job untouched (1-60)",
    )
    i.add_argument("--print", action="store_true", help="print the rendered rule instead of installing it")
    i.add_argument("--oaradmissionrules", default="oaradmissionrules", help="path of OAR's oaradmissionrules command")
    i.set_defaults(func=_install)
    u = osub.add_parser(
        "uninstall-rules",
        help="remove the vjob admission rule",
        description="Remove every vjob rule from OAR's admission_rules table (oarsub then ignores vjob entirely "
        "and -t vjob=... is refused by OAR's type check).",
        epilog="example: vjob oar uninstall-rules",
    )
    u.add_argument("--oaradmissionrules", default="oaradmissionrules", help="path of OAR's oaradmissionrules command")
    u.set_defaults(func=_uninstall)
    d = osub.add_parser(
        "install-deadline-rule",
        help="install (or replace) the deadline rule: refuse oarsub -t deadline=DATE when x >= X",
        description="Install vjob's deadline admission rule with oaradmissionrules (saline_bew.deadline_rule): "
        "a job with OAR's -t deadline=DATE whose x-factor is at or over the X the agent publishes in "
        "[deadline] threshold_file is refused with x, X and why; without a usable file every job is accepted.",
        epilog="example: vjob oar install-deadline-rule --threshold-file /var/lib/vjob/vjob-deadline.threshold",
    )
    d.add_argument("--threshold-file", default=None, help="the file the agent publishes X in "
                   "(default: [deadline] threshold_file, which must then be set)")  # fmt: skip
    d.add_argument("--print", action="store_true", help="print the rendered rule instead of installing it")
    d.add_argument("--oaradmissionrules", default="oaradmissionrules", help="path of OAR's oaradmissionrules command")
    d.set_defaults(func=_install_deadline)
    du = osub.add_parser(
        "uninstall-deadline-rule",
        help="remove vjob's deadline admission rule",
        description="Remove vjob's deadline rule from OAR's admission_rules table (jobs with -t deadline= are then "
        "accepted without the x-factor check).",
        epilog="example: vjob oar uninstall-deadline-rule",
    )
    du.add_argument("--oaradmissionrules", default="oaradmissionrules", help="path of OAR's oaradmissionrules command")
    du.set_defaults(func=_uninstall_deadline)


def _install(args: argparse.Namespace) -> int:
    config = load_config(args)
    names = [s.name for s in config.saline.sites]
    site = args.site
    if site is None:
        if len(names) != 1:
            raise UsageError(f"--site: required with {len(names)} configured sites ({', '.join(names) or 'none'})")
        site = names[0]
    elif site not in names:
        raise UsageError(f"--site {site!r}: not in saline.sites ({', '.join(names) or 'none configured'})")
    socket = str(server.socket_path(args.socket, configured=config.saline.socket))
    rule = admission.render(site=site, socket=socket, timeout_s=args.timeout)
    if args.print:
        print(rule, end="")
        return 0
    new, replaced = admission.install(rule, args.oaradmissionrules)
    print(f"vjob admission rule #{new} installed for site {site}" + (f" (replaced #{replaced})" if replaced else ""))
    return 0


def _uninstall(args: argparse.Namespace) -> int:
    removed = admission.uninstall(args.oaradmissionrules)
    print(f"vjob admission rule{'s' if len(removed) > 1 else ''} #{removed} removed" if removed else "no vjob rule")
    return 0


def _install_deadline(args: argparse.Namespace) -> int:
    path = args.threshold_file or load_config(args).deadline.threshold_file
    if not path:
        raise UsageError("--threshold-file: required, or set [deadline] threshold_file (OAR has no default place)")
    rule = deadline_rule.render(threshold_file=path)
    if args.print:
        print(rule, end="")
        return 0
    new, replaced = deadline_rule.install(rule, args.oaradmissionrules)
    print(f"vjob deadline rule #{new} installed, reading {path}" + (f" (replaced #{replaced})" if replaced else ""))
    return 0


def _uninstall_deadline(args: argparse.Namespace) -> int:
    removed = deadline_rule.uninstall(args.oaradmissionrules)
    print(f"vjob deadline rule #{removed} removed" if removed else "no vjob deadline rule")
    return 0
