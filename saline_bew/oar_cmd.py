"""`vjob oar install-rules|uninstall-rules` (and the deadline and size rules): put vjob's
admission rules into OAR, or take them out.

Why a command: the rule names this installation's Python, the site it belongs to and the
manager's socket, so it is rendered here from the configuration rather than copied by hand
(saline_bew.admission explains the rule and why it fails open).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from vjob.cli import load_config
from vjob.errors import UsageError

# The rules' modules (pydantic through the OAR grammar) are imported by the commands when they
# run, so that `vjob oar --help` loads none of them (issue 36: every `--help` under 0.3 s).


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
        "(priority 15); an earlier vjob rule is replaced. Users then submit best-effort "
        "vjobs with oarsub -t besteffort -t vjob=IMAGE [-t vjob_vms=N] COMMAND.",
        epilog="example: vjob oar install-rules --site nancy --socket /run/vjob/saline.sock",
    )
    i.add_argument(
        "--site",
        metavar="SITE",
        default=None,
        help="the Saline site this OAR serves (default: the only configured site)",
    )
    i.add_argument(
        "--socket",
        metavar="PATH",
        default=None,
        help="the manager's socket path the rule's hook calls (default saline.socket)",
    )
    i.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=int,
        default=None,
        help="seconds oarsub waits for the site master before accepting the job untouched (1-60; default 10)",
    )
    _rule_options(i, _install, install=True)
    u = osub.add_parser(
        "uninstall-rules",
        help="remove the vjob admission rule",
        description="Remove every vjob rule from OAR's admission_rules table (oarsub then ignores vjob entirely "
        "and -t vjob=... is refused by OAR's type check).",
        epilog="example: vjob oar uninstall-rules",
    )
    _rule_options(u, _uninstall, install=False)
    d = osub.add_parser(
        "install-deadline-rule",
        help="install (or replace) the deadline rule: refuse oarsub -t deadline=DATE when x >= X",
        description="Install vjob's deadline admission rule with oaradmissionrules (saline_bew.deadline_rule): "
        "a job with OAR's -t deadline=DATE whose x-factor is at or over the X the agent publishes in "
        "[deadline] threshold_file is refused with x, X and why; without a usable file every job is accepted.",
        epilog="example: vjob oar install-deadline-rule --threshold-file /var/lib/vjob/vjob-deadline.threshold",
    )
    d.add_argument(
        "--threshold-file",
        metavar="FILE",
        default=None,
        help="the file the agent publishes X in (default: [deadline] threshold_file, which must then be set)",
    )
    _rule_options(d, _install_deadline, install=True)
    du = osub.add_parser(
        "uninstall-deadline-rule",
        help="remove vjob's deadline admission rule",
        description="Remove vjob's deadline rule from OAR's admission_rules table (jobs with -t deadline= are then "
        "accepted without the x-factor check).",
        epilog="example: vjob oar uninstall-deadline-rule",
    )
    _rule_options(du, _uninstall_deadline, install=False)
    z = osub.add_parser(
        "install-size-rule",
        help="install (or replace) the size rule: refuse a pilot job whose hosts cannot hold its VM",
        description="Install vjob's size admission rule with oaradmissionrules (saline_bew.size_rule): an "
        "`oarsub ... vjob run` job whose fewest cores per host times the largest memcore, minus [provisioning] "
        "vm_overhead_mib, is below the guest's minimum is refused with the numbers; fails open.",
        epilog="example: vjob oar install-size-rule",
    )
    _rule_options(z, _install_size, install=True)
    zu = osub.add_parser(
        "uninstall-size-rule",
        help="remove vjob's size admission rule",
        description="Remove vjob's size rule from OAR's admission_rules table.",
        epilog="example: vjob oar uninstall-size-rule",
    )
    _rule_options(zu, _uninstall_size, install=False)


def _rule_options(parser: Any, func: Callable[[argparse.Namespace], int], *, install: bool) -> None:
    """The options every rule command shares (both rules go through oaradmissionrules)."""
    if install:
        parser.add_argument("--print", action="store_true", help="print the rendered rule instead of installing it")
    parser.add_argument(
        "--oaradmissionrules",
        metavar="PATH",
        default="oaradmissionrules",
        help="path of OAR's oaradmissionrules command",
    )
    parser.set_defaults(func=func)


def _install(args: argparse.Namespace) -> int:
    from saline_bew import admission, protocol  # heavy: pydantic

    config = load_config(args)
    names = [s.name for s in config.saline.sites]
    site = args.site
    if site is None:
        if len(names) != 1:
            raise UsageError(f"--site: required with {len(names)} configured sites ({', '.join(names) or 'none'})")
        site = names[0]
    elif site not in names:
        raise UsageError(f"--site {site!r}: not in saline.sites ({', '.join(names) or 'none configured'})")
    socket = str(protocol.socket_path(args.socket, configured=config.saline.socket))
    chosen = next(s for s in config.saline.sites if s.name == site)
    rule = admission.render(
        site=site,
        socket=socket,
        timeout_s=admission.HOOK_TIMEOUT_S if args.timeout is None else args.timeout,
        default_image=chosen.default_image,
        allow_opt_out=chosen.allow_opt_out,
    )
    return _put(args, rule, admission.MARK, "vjob admission rule", f"installed for site {site}")


def _uninstall(args: argparse.Namespace) -> int:
    from saline_bew import admission  # heavy: pydantic

    return _take_out(args, admission.MARK, "vjob admission rule", "no vjob rule")


def _install_deadline(args: argparse.Namespace) -> int:
    from saline_bew import deadline_rule  # heavy: pydantic

    path = args.threshold_file or load_config(args).deadline.threshold_file
    if not path:
        raise UsageError("--threshold-file: required, or set [deadline] threshold_file (OAR has no default place)")
    rule = deadline_rule.render(threshold_file=path)
    return _put(args, rule, deadline_rule.MARK, "vjob deadline rule", f"installed, reading {path}")


def _uninstall_deadline(args: argparse.Namespace) -> int:
    from saline_bew import deadline_rule  # heavy: pydantic

    return _take_out(args, deadline_rule.MARK, "vjob deadline rule", "no vjob deadline rule")


def _install_size(args: argparse.Namespace) -> int:
    from saline_bew import size_rule  # heavy: pydantic

    overhead = load_config(args).provisioning.vm_overhead_mib
    rule = size_rule.render(overhead_mib=overhead)
    return _put(args, rule, size_rule.MARK, "vjob size rule", f"installed, overhead {overhead} MiB per VM")


def _uninstall_size(args: argparse.Namespace) -> int:
    from saline_bew import size_rule  # heavy: pydantic

    return _take_out(args, size_rule.MARK, "vjob size rule", "no vjob size rule")


def _put(args: argparse.Namespace, rule: str, mark: str, what: str, done: str) -> int:
    """What both install commands do with their rendered rule: print it (`--print`), or add it
    with OAR's oaradmissionrules, replacing the earlier rules of the same first line `mark`."""
    from saline_bew import admission  # heavy: pydantic

    if args.print:
        print(rule, end="")
        return 0
    new, replaced = admission.install(rule, args.oaradmissionrules, mark=mark)
    print(f"{what} #{new} {done}" + (f" (replaced #{replaced})" if replaced else ""))
    return 0


def _take_out(args: argparse.Namespace, mark: str, what: str, none: str) -> int:
    """What both uninstall commands do: remove every rule whose first line is `mark`."""
    from saline_bew import admission  # heavy: pydantic

    removed = admission.uninstall(args.oaradmissionrules, mark=mark)
    print(f"{what}{'s' if len(removed) > 1 else ''} #{removed} removed" if removed else none)
    return 0
