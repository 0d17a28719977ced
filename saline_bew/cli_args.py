"""`vjob besteffort`'s arguments; its actions are saline_bew.cli, imported when one runs.

Why apart: saline_bew.cli imports the manager's socket protocol, its server, the store and
pydantic, about 0.9 s, and `vjob besteffort --help` should cost none of it (issue 36: every
`--help` under 0.3 s).
"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    """`vjob besteffort` and its actions, one function per action (in the order `--help` lists them)."""
    p = sub.add_parser(
        "besteffort",
        help="Saline: best-effort OAR jobs that survive being killed",
        description="Best-effort vjobs on OAR (Saline): snapshotted periodically and on OAR's checkpoint "
        "signal, resubmitted from their last snapshot at this site or another when OAR kills them. Users "
        "talk to the site's manager through its socket; the manager runs as root.",
        epilog="example: vjob besteffort submit --image debian12 --vms 2 -l 2:00:00 -- ./simulate.sh 42",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--socket",
        metavar="PATH",
        default=None,
        help="the manager's socket path (default $VJOB_SALINE_SOCKET, else saline.socket for the manager, "
        "else /run/vjob/saline.sock)",
    )
    bsub = p.add_subparsers(dest="besteffort_command", metavar="ACTION", required=True)
    _add_submit(bsub)
    _add_manager(bsub)
    _add_queries(bsub)
    _add_output(bsub)
    _add_stage(bsub)


def _add_submit(bsub: Any) -> None:
    """submit: a user's vjob, their current directory going with it (saline_bew.workdir)."""
    s = bsub.add_parser(
        "submit",
        help="submit a best-effort vjob: vjob besteffort submit [options] -- COMMAND ...",
        description="Submit a best-effort vjob; prints its key (OAR's job is named after it).",
        epilog="example: vjob besteffort submit --image debian12 --memory 512 -- python3 fit.py --steps 1000",
    )
    s.add_argument("--image", metavar="IMAGE", required=True, help="OS image from the catalogue")
    s.add_argument("--vms", metavar="N", type=int, default=1, help="number of VMs (one OAR resource each)")
    s.add_argument("--vcpus", metavar="N", type=int, default=1, help="virtual CPUs per VM (default 1)")
    s.add_argument("--memory", metavar="MIB", type=int, default=128, help="MiB per VM")
    s.add_argument(
        "-l",
        "--walltime",
        metavar="H:MM:SS",
        dest="walltime",
        default=None,
        help="H:MM:SS (default saline.default_walltime)",
    )
    s.add_argument(
        "--site", metavar="SITE", default=None, help="site to start at (default: the first with free resources)"
    )
    s.add_argument(
        "--user", metavar="USER", default=None, help="submit for this user (root only, checked by the manager)"
    )
    s.add_argument(
        "--no-workdir",
        action="store_true",
        help="do not copy the current directory to the first VM's /work (by default it is, as on Slurm)",
    )
    s.add_argument(
        "--stage-limit-mb",
        metavar="MB",
        type=int,
        default=None,
        help="refuse a current directory bigger than this (default: [provisioning] stage_limit_mb's built-in value;"
        " the manager enforces the site's own limit too)",
    )
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...], run inside the VMs")
    s.set_defaults(func=_submit)


def _add_manager(bsub: Any) -> None:
    """manager: the site master, run as root by its systemd unit."""
    m = bsub.add_parser(
        "manager",
        help="run the job manager (snapshots, kill detection, resubmission)",
        description="The site master: runs as root (systemd unit: vjob deploy install saline-unit), listens on "
        "the socket, snapshots, detects kills and resubmits.",
        epilog="example: vjob --config /etc/vjob/vjob.toml besteffort manager --socket-group vjobusers",
    )
    m.add_argument("--once", action="store_true", help="one pass, then exit (no socket)")
    m.add_argument(
        "--socket-group",
        metavar="GROUP",
        default=None,
        help="only this group (and root) may use the socket (mode 0660); default saline.socket_group, "
        "empty: everyone (0666)",
    )
    m.set_defaults(func=_manager)


def _add_queries(bsub: Any) -> None:
    """list, show, cancel: a user's look at (and hand on) their own vjobs."""
    ls = bsub.add_parser(
        "list",
        help="your best-effort vjobs and their state (root: everyone's)",
        description="Your best-effort vjobs (root: everyone's), one line each: key, state, site, kills.",
        epilog="example: vjob besteffort list --json",
    )
    ls.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    ls.set_defaults(func=_list)

    sh = bsub.add_parser(
        "show",
        help="one of your vjobs with its journal",
        description="One of your vjobs with its journal: submissions, snapshots, kills, resumptions.",
        epilog="example: vjob besteffort show be0123456789",
    )
    sh.add_argument("key", help="the vjob's key, as submit printed it (be + 10 hex digits)")
    sh.set_defaults(func=_show)

    c = bsub.add_parser(
        "cancel",
        help="end one of your vjobs: delete its OAR job, VMs and snapshots",
        description="End one of your vjobs: the manager holding it deletes its OAR job, VMs and snapshots.",
        epilog="example: vjob besteffort cancel be0123456789",
    )
    c.add_argument("key", help="the vjob's key, as submit printed it (be + 10 hex digits)")
    c.set_defaults(func=_cancel)


def _add_output(bsub: Any) -> None:
    """output: what COMMAND printed, passed as a descriptor of root's copy (saline_bew.output)."""
    o = bsub.add_parser(
        "output",
        help="what COMMAND printed (its stdout, or --stderr)",
        description="What COMMAND printed in the first VM: up to the last snapshot while it runs, all of it once "
        "it ended (kept 7 days). Its exit status is in `show` (exit_code).",
        epilog="example: vjob besteffort output be0123456789 > result.txt",
    )
    o.add_argument("key", help="the vjob's key")
    o.add_argument("--stderr", action="store_true", help="its standard error instead")
    o.add_argument("--both", action="store_true", help="its stdout to stdout and its stderr to stderr")
    o.set_defaults(func=_output)


def _add_stage(bsub: Any) -> None:
    """stage: the holder's half of an oarsub vjob's directory (saline_bew.staging)."""
    st = bsub.add_parser(
        "stage",
        help="(run by the holder of an oarsub vjob) send the current directory to the first VM",
        description="Run by the OAR job of a vjob submitted with oarsub, as the user, in the submission directory: "
        "builds its job disk with the user's rights and passes it to the manager (as submit does).",
        epilog="example (holder.sh, as OAR runs it): vjob besteffort --socket /run/vjob/saline.sock stage be0123456789",
    )
    st.add_argument("key", help="the vjob's key")
    st.add_argument(
        "--stage-limit-mb",
        metavar="MB",
        type=int,
        default=None,
        help="refuse a directory bigger than this (default: [provisioning] stage_limit_mb's built-in value)",
    )
    st.set_defaults(func=_stage)


def _submit(args: argparse.Namespace) -> int:
    from saline_bew.cli import submit_cmd  # heavy: pydantic

    return submit_cmd(args)


def _manager(args: argparse.Namespace) -> int:
    from saline_bew.cli import manager_cmd  # heavy: pydantic

    return manager_cmd(args)


def _list(args: argparse.Namespace) -> int:
    from saline_bew.cli import list_cmd  # heavy: pydantic

    return list_cmd(args)


def _show(args: argparse.Namespace) -> int:
    from saline_bew.cli import show_cmd  # heavy: pydantic

    return show_cmd(args)


def _cancel(args: argparse.Namespace) -> int:
    from saline_bew.cli import cancel_cmd  # heavy: pydantic

    return cancel_cmd(args)


def _output(args: argparse.Namespace) -> int:
    from saline_bew.cli import output_cmd  # heavy: pydantic

    return output_cmd(args)


def _stage(args: argparse.Namespace) -> int:
    from saline_bew.cli import stage_cmd  # heavy: pydantic

    return stage_cmd(args)
