"""`vjob prio`: the UBIS priority of every pending job, like `sprio`, with per-term explanations.

Why sources as a table of loaders: the priorities do not care where the ClusterView comes
from. `--from FILE` reads a saved view (docs/clusterview.md); a live RMS source plugs in by
adding an option to the `source` group and a loader `(value, config) -> ClusterView` to
VIEW_SOURCES under the option's dest — nothing else here changes.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vjob.cli import load_config
from vjob.errors import InputError

if TYPE_CHECKING:
    from agent.prio_order import Placed
    from ubis_priority.view import Explanation, Priorities
    from vjob.config import Config
    from vjob.model import ClusterView

# The priorities (numpy, numba) and the agent are imported by the functions that use them, so
# that `vjob prio --help` loads neither (issue 36).

COLUMNS: dict[str, str] = {
    "usage": "USAGE",
    "queue_time": "QTIME",
    "os_available": "OS",
    "preempt_count": "PN",
    "preempt_time": "PT",
    "free_nodes": "FREE",
    "interactive": "INTER",
}
"""Table headers of the weighted terms, sprio-style."""


def view_from_file(value: str, _config: Config) -> ClusterView:
    """A ClusterView saved as JSON (`-` reads standard input)."""
    from vjob.model import ClusterView  # heavy: pydantic

    if value == "-":
        text, source = sys.stdin.read(), "<stdin>"
    else:
        path = Path(value)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(f"{path}: cannot read the snapshot: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise InputError(f"{path}: not UTF-8 text (expected a ClusterView JSON file)") from None
        source = str(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return ClusterView.from_dict(data, source=source)


def view_from_rms(value: str, config: Config) -> ClusterView:
    """The live view of an RMS, as the agent observes it (agent.loop.live_view)."""
    from agent.loop import live_view  # heavy: numba

    return live_view(value, config)


VIEW_SOURCES: dict[str, Callable[[str, Config], ClusterView]] = {"snapshot": view_from_file, "rms": view_from_rms}
"""Option dest → loader; exactly one source option is given on the command line."""


EPILOG = """\
examples:
  vjob prio --rms slurm                      live, as the agent would compute them now
  vjob prio --from view.json --format csv    a saved cluster view (docs/clusterview.md)
  vjob prio --rms pbs --explain 1234.server  raw -> normalised -> weighted, per term
  vjob prio --rms slurm --explain            the queue in the policy's order: tier, terms

Columns: PRIORITY (0..sum of the weights), SITE (Slurm site factor sent), PBS (qalter -p value),
then each weighted term."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "prio",
        help="show the UBIS priority of pending jobs (like sprio)",
        description="UBIS priorities of the pending jobs, each weighted term shown; see docs/priority.md.",
        epilog=EPILOG,
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--from",
        dest="snapshot",
        metavar="SNAPSHOT.json",
        help="a saved ClusterView ('-': stdin; `vjob schema clusterview`)",
    )
    source.add_argument("--rms", choices=("slurm", "pbs", "oar"), help="the live jobs of this RMS")
    p.add_argument("--format", choices=("table", "json", "csv"), default="table", help="output format (default table)")
    p.add_argument("--json", dest="format", action="store_const", const="json", help="the same as --format json")
    p.add_argument(
        "--explain",
        metavar="JOBID",
        nargs="?",
        const="",
        help="alone: the queue in the policy's order with each job's tier and weighted terms; "
        "with JOBID: raw → normalised → weighted for every term of that job",
    )
    p.add_argument("--users", action="store_true", help="each user's target, decayed usage and term (like sshare)")
    p.set_defaults(func=_prio)


def load_view(args: argparse.Namespace, config: Config) -> ClusterView:
    for dest, loader in VIEW_SOURCES.items():
        value = getattr(args, dest, None)
        if value is not None:
            return loader(value, config)
    raise InputError("vjob prio: give a source of jobs (--from SNAPSHOT.json)")


def _prio(args: argparse.Namespace) -> int:
    from agent.prio_order import pass_order, render_order  # heavy: numba
    from agent.prio_users import render_users  # heavy: pydantic
    from ubis_priority.user_shares import user_shares  # heavy: pydantic
    from ubis_priority.view import compute  # heavy: pydantic

    config = load_config(args)
    view = load_view(args, config)
    if getattr(args, "users", False):  # agent.prio_users
        sys.stdout.write(render_users(user_shares(view, config.priority), args.format))
        return 0
    prios = compute(view, config.priority)
    if args.explain == "":
        order = pass_order(view, config, prios)
        policy = config.scheduling.policy
        sys.stdout.write(
            render_order(
                order,
                args.format,
                policy=policy,
                max_priority=prios.terms.max_priority,
                columns=COLUMNS,
                within=config.scheduling.tier_order,
            )
        )
        return 0
    if args.explain is not None:
        try:
            explanation = prios.explain(args.explain)
        except KeyError:
            known = "it is not in the view" if args.explain not in {j.id for j in view.jobs} else "it is not pending"
            raise InputError(f"--explain {args.explain}: no priority for this job: {known}") from None
        job = next(j for j in prios.jobs if j.id == args.explain)
        where = _where(pass_order(view, config, prios), args.explain, config.scheduling.policy)
        sys.stdout.write(
            render_explanation(explanation, args.format, os_image=job.os_image, nodes=job.nodes, where=where)
        )
        return 0
    sys.stdout.write(render(prios, args.format, site_factor_max=config.slurm.site_factor_max))
    return 0


def _where(order: list[Placed], job_id: str, policy: str) -> str:
    """Where the explained job stands in the policy's order, and in which tier."""
    me = next(r for r in order if r.job == job_id)
    if me.place is None:
        return f"not in the {policy} policy's order: held, and not by vjob"
    queued = sum(r.place is not None for r in order)
    tier = f", tier {me.tier}" if me.tier != "-" else ""
    return f"place {me.place} of {queued} in the {policy} policy's order{tier}"


def rows(prios: Priorities, *, site_factor_max: int) -> list[dict[str, Any]]:
    """One dict per pending job, highest priority first."""
    from ubis_priority.integers import pbs_priority, slurm_site_factor  # heavy: pydantic
    from ubis_priority.terms import TERMS  # heavy: pydantic

    t = prios.terms
    site = slurm_site_factor(t.priority, t.max_priority, site_factor_max)
    pbs = pbs_priority(t.priority, t.max_priority)
    out = []
    for i in prios.ranked():
        job = prios.jobs[i]
        row: dict[str, Any] = {
            "job": job.id,
            "user": job.user,
            "class": job.job_class.value,
            "priority": float(t.priority[i]),
            "site_factor": int(site[i]),
            "pbs": int(pbs[i]),
        }
        row.update({name: float(t.weighted[k, i]) for k, name in enumerate(TERMS)})
        out.append(row)
    return out


def render(prios: Priorities, fmt: str, *, site_factor_max: int) -> str:
    from ubis_priority.terms import TERMS  # heavy: pydantic

    data = rows(prios, site_factor_max=site_factor_max)
    if fmt == "json":
        return json.dumps({"max_priority": prios.terms.max_priority, "jobs": data}, indent=2) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=["job", "user", "class", "priority", "site_factor", "pbs", *TERMS])
        writer.writeheader()
        writer.writerows(data)
        return buf.getvalue()
    header = ["JOBID", "USER", "PRIORITY", "SITE", "PBS", *COLUMNS.values()]
    lines = [header]
    for r in data:
        lines.append(
            [
                r["job"],
                r["user"],
                f"{r['priority']:.4f}",
                str(r["site_factor"]),
                str(r["pbs"]),
                *(f"{r[name]:.4f}" for name in TERMS),
            ]
        )
    return _columns(lines) + (f"({len(data)} pending jobs; priorities in 0..{prios.terms.max_priority:g})\n")


def available_os(e: Explanation, nodes: int) -> int:
    """UBIS's N_availableOS of the explained job: the free nodes already running its image
    (every free node when it asks for none). The term's raw value is N_availableOS − N_reqOS."""
    raw = next(t.raw for t in e.terms if t.term == "os_available")
    return round(raw + nodes)


def render_explanation(e: Explanation, fmt: str, *, os_image: str = "", nodes: int = 1, where: str = "") -> str:
    """The terms of one job, and N_availableOS spelled out: the nodes' OS comes from the store
    (node_images), and an operator checking why a job waits wants the count, not a difference.
    `where`: its place (and tier) in the policy's order, added to the table's first line and
    to the JSON."""
    avail = available_os(e, nodes)
    if fmt == "json":
        extra = {"os_image": os_image, "n_available_os": avail, "n_req_os": nodes, "order": where}
        return json.dumps({**e.to_dict(), **extra}, indent=2) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["term", "raw", "normalised", "weight", "weighted", "scale", "note"])
        for t in e.terms:
            writer.writerow([t.term, t.raw, t.normalised, t.weight, t.weighted, t.scale, t.note])
        return buf.getvalue()
    running = f"free nodes running {os_image}" if os_image else "free nodes (no image asked)"
    spelled = f"N_availableOS = {avail} {running}, N_reqOS = {nodes}"
    lines = [["TERM", "RAW", "NORMALISED", "WEIGHT", "WEIGHTED", "SCALE"]]
    for t in e.terms:
        note = f"{spelled}; {t.note}" if t.term == "os_available" and t.note else t.note
        note = spelled if t.term == "os_available" and not t.note else note
        scale = t.scale + (f"  [{note}]" if note else "")
        lines.append([t.term, f"{t.raw:g}", f"{t.normalised:.4f}", f"{t.weight:g}", f"{t.weighted:.4f}", scale])
    head = f"job {e.job_id} (user {e.user}): priority {e.priority:.4f} of at most {e.max_priority:g}"
    head += f"; {where}\n" if where else "\n"
    return head + _columns(lines)


def _columns(lines: list[list[str]]) -> str:
    """Left-aligned columns, two spaces apart, no trailing blanks."""
    widths = [max(len(line[c]) for line in lines) for c in range(len(lines[0]))]
    out = []
    for line in lines:
        cells = [cell.ljust(width) for cell, width in zip(line, widths, strict=True)]
        out.append("  ".join(cells).rstrip() + "\n")
    return "".join(out)
