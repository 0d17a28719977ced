"""`vjob status`: the vjobs, their VMs and the recent preemptions, from the pilots and the store.

Why from those two and not from the RMS: status must answer when the RMS or the database is
down — it is what an operator runs first. Each source that fails is reported on stderr and the
rest still printed; an unreadable store makes the exit status 1, so a script can tell.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from vjob import text_table
from vjob.cli import load_config
from vjob.errors import StoreError

# The agent's modules, the store and the pilots' files are imported by the functions that read
# them: `vjob status --help` then loads no numba, SQLAlchemy or pydantic (issue 36).

EPILOG = """\
examples:
  vjob status                      vjobs of [agent] rms and the last 10 context switches
  vjob status --rms pbs --switches 50
  vjob status --json | jq '.vjobs[] | select(.pilot == "saved")'
  vjob status --snapshots 100       the 100 newest snapshots (memory states) with size and sha256

Works with the RMS or the database down: each source that fails is a warning on stderr. In a
pipe the tables are plain aligned text; on a narrow terminal each row becomes a block. Exit 1
when the store could not be read (the rest is still printed), 2 on bad usage."""


MAX_ROWS = 10_000
"""The most switches or snapshots `vjob status` lists: more is a mistake, not a report."""


def _count(text: str) -> int:
    """A row count for --switches / --snapshots: argparse names the option and the value when
    this raises (exit 2)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a whole number") from None
    if not 0 <= n <= MAX_ROWS:
        raise argparse.ArgumentTypeError(f"{n}: must be 0..{MAX_ROWS}")
    return n


def register(sub: Any) -> None:
    p = sub.add_parser(
        "status",
        help="vjobs, VMs and recent preemptions",
        description="The vjobs (from their pilots' state files and the store: node, state, saves, Pn, Pt), "
        "the recent context switches with their victims and the snapshots in the store.",
        epilog=EPILOG,
    )
    p.add_argument("--rms", choices=("slurm", "pbs", "oar"), help="only this RMS's vjobs (default: [agent] rms)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument(
        "--switches", type=_count, default=10, metavar="N", help=f"recent switches to show, 0..{MAX_ROWS} (default 10)"
    )
    p.add_argument(
        "--snapshots",
        type=_count,
        default=20,
        metavar="N",
        help="newest snapshots to list, whoever took them: pilot, agent, Saline, `vjob vm save` (default 20)",
    )
    p.set_defaults(func=_status)


def collect(cfg: Any, rms: str, switches: int = 10, snapshots: int = 20) -> dict[str, Any]:
    """Everything `vjob status` shows, as plain data (also used by the demo)."""
    out: dict[str, Any] = {"rms": rms, "at": time.time(), "vjobs": [], "switches": [], "snapshots": [], "errors": []}
    records: dict[str, Any] = {}
    hosts: dict[str, list[str]] = {}
    """Where root recorded each job's VMs (the `vms` rows): the real hosts, which after a
    remapping swap are not the nodes the RMS shows for the job."""
    moves: dict[str, list[str]] = {}
    from agent.observe import hear, store_records  # heavy: sqlalchemy
    from vjob.pilot_files import all_dirs, pilot_root, vms_of  # heavy: pydantic
    from vjob.store import journal  # heavy: sqlalchemy
    from vjob.store import snapshots as store_snapshots  # heavy: sqlalchemy
    from vjob.store import vms as store_vms  # heavy: sqlalchemy
    from vjob.store.db import open_store  # heavy: sqlalchemy

    store = None
    out["drained"] = None
    try:
        store = open_store(cfg)
        out["drained"] = _drained(store, rms)
    except StoreError as exc:
        out["errors"].append(f"state store: {exc}")
    dirs = all_dirs(pilot_root(cfg), rms)
    if store is not None:
        try:  # whose directory to believe: the user the store recorded for the job (the RMS's)
            records.update(store_records(store, rms, sorted({d.job_id for d in dirs})))
        except StoreError as exc:
            out["errors"].append(f"state store: {exc}")
    # The agent's owner rule (agent.observe.hear): a job's directory is heard only when its
    # user or root owns it; with the store down, only root's. A squatter's row is never shown.
    heard, refused = hear(dirs, {job_id: rec.user for job_id, rec in records.items()})
    out["errors"] += [f"{error}: the agent ignores this state" for _job, _vm, error in refused]
    pilots = [st for _pdir, st in heard.values()]
    if store is not None:
        try:
            for st in pilots:
                hosts[st.job_id] = sorted({vm.node for vm in store_vms.of_job(store, rms, st.job_id)})
            for m in journal.migrations(store, rms, [st.job_id for st in pilots]):
                moves.setdefault(m.rms_job_id, []).append(f"{m.source}->{m.destination}")
            for sw in journal.recent(store, switches):
                times = journal.action_times(store, sw.id)
                out["switches"].append(
                    {
                        "id": sw.id,
                        "state": sw.state,
                        "reason": sw.reason,
                        "cost": sw.plan.get("cost"),
                        "actions": [
                            {
                                "job": a.rms_job_id,
                                "action": a.action,
                                "node": a.source,
                                "state": a.state,
                                "started_at": times[a.id][0],
                                "finished_at": times[a.id][1],
                                "error": times[a.id][2],
                            }
                            for a in sw.actions
                        ],
                    }
                )
            out["snapshots"] = [r.to_json() for r in store_snapshots.listing(store, rms=rms, limit=max(0, snapshots))]
        except StoreError as exc:
            out["errors"].append(f"state store: {exc}")
        finally:
            store.close()
    for st in pilots:
        rec = records.get(st.job_id)
        # the VMs as the agent believes them: named from the job id, one per node of a multi-node pilot
        vms = [{"vm": vm, "node": node} for vm, node in vms_of(st)]
        out["vjobs"].append(
            {
                "job": st.job_id,
                "vm": st.vm,
                "vms": vms,
                "node": st.node,
                "pilot": st.state.value,
                "since": st.since,
                "image": st.image,
                "boots": st.boots,
                "restores": st.restores,
                "local_restores": st.local_restores,
                "save_seconds": st.save_seconds,
                "save_bytes": st.save_bytes,
                "preempt_count": rec.preempt_count if rec else None,
                "preempted_seconds": rec.preempted_seconds if rec else None,
                "vjob_state": rec.vjob_state if rec else None,
                "hosts": hosts.get(st.job_id),
                "migrations": moves.get(st.job_id, []),
            }
        )
    out["deadline"] = read_deadline_status(cfg, out["errors"])
    out["remap"] = read_remap_status(cfg, out["errors"])
    out["control"] = read_control_status(cfg, out["errors"])
    out["waiting"] = read_wait_status(cfg, out["errors"])
    for v in out["vjobs"]:
        v.update(out["deadline"]["jobs"].get(v["job"], {}))
        v["remap_skipped"] = out["remap"]["skipped"].get(v["job"])
        v["control"] = out["control"]["vjobs"].get(v["job"])
    return out


def _drained(store: Any, rms: str) -> dict[str, Any] | None:
    """`vjob drain`'s mark (agent.drain): who and since when; None when not drained."""
    from agent.drain import mark_name, read_mark  # heavy: sqlalchemy

    found = read_mark(store, mark_name(rms))
    return None if found is None else {"by": found.by, "since": found.since}


def _read_status_file(path: Path, errors: list[str], what: str, empty: dict[str, Any], table: str) -> dict[str, Any]:
    """A status object the agent rewrites in its data directory, its keys of `empty` (whose
    `table` must be an object); `empty` when missing or broken (a broken one is a warning:
    `vjob status` still answers)."""
    try:
        doc = json.loads(path.read_bytes()[: 4 * 2**20])
    except FileNotFoundError:
        return empty
    except (OSError, ValueError) as exc:
        errors.append(f"{path}: unreadable {what}: {exc}")
        return empty
    if not isinstance(doc, dict) or not isinstance(doc.get(table), dict):
        errors.append(f"{path}: not a {what} object")
        return empty
    return empty | {k: doc[k] for k in empty if k in doc}


def read_remap_status(cfg: Any, errors: list[str]) -> dict[str, Any]:
    """The remapping step's last summary (agent.remap_step.publish): why it left each vjob alone,
    its last moves and balloon targets. Missing: remapping never ran."""
    from agent.remap_step import STATUS_NAME  # heavy: pydantic

    empty: dict[str, Any] = {"at": None, "skipped": {}, "moves": [], "memory": []}
    return _read_status_file(cfg.data_path / STATUS_NAME, errors, "remap status", empty, "skipped")


def read_control_status(cfg: Any, errors: list[str]) -> dict[str, Any]:
    """The control loop's last step (agent.consolidate.record): each vjob's target and why, the
    overloaded nodes, the plan and its switch. Missing: the loop never ran (planner.interval_s 0)."""
    from agent.consolidate import STATUS_NAME  # heavy: pydantic

    empty: dict[str, Any] = {"at": None, "policy": None, "vjobs": {}, "overloaded": {}, "unmeasured": [], "plan": None}
    return _read_status_file(cfg.data_path / STATUS_NAME, errors, "control loop status", empty, "vjobs")


def read_wait_status(cfg: Any, errors: list[str]) -> dict[str, Any]:
    """Why each held-back interactive job waits, as the agent's last tick said
    (agent.wait_notice). Missing: no agent ticked here yet."""
    from agent.wait_notice import STATUS_NAME  # heavy: numba

    return _read_status_file(cfg.data_path / STATUS_NAME, errors, "wait reasons", {"at": None, "jobs": {}}, "jobs")


def read_deadline_status(cfg: Any, errors: list[str]) -> dict[str, Any]:
    """The agent's last deadline evaluation (agent.deadline): X and each job's deadline, x and
    predicted end. Missing file: no deadline policy ran; a broken one is a warning."""
    from agent.deadline import STATUS_NAME  # heavy: numba

    empty: dict[str, Any] = {
        "X": None,
        "admission": None,
        "failure_rate": None,
        "at": None,
        "vo_model": None,
        "jobs": {},
    }
    return _read_status_file(cfg.data_path / STATUS_NAME, errors, "deadline status", empty, "jobs")


class _Out:
    """Where the tables go: standard output, fitted to the terminal when it is one (the width is
    None in a pipe: aligned columns, one line per row). Has what the printers use of a rich
    Console (`print`, `width`), so a test may hand them one."""

    def __init__(self) -> None:
        self.width = text_table.terminal_width(sys.stdout)

    def print(self, text: str = "", **_style: Any) -> None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _table(out: Any, title: str, headers: tuple[str, ...], rows: list[list[Any]]) -> None:
    out.print(text_table.render(title, headers, rows, getattr(out, "width", None)), markup=False)


VJOB_COLUMNS = (
    "job",
    "VM",
    "node",
    "hosts (store)",
    "moves",
    "pilot",
    "image",
    "boots",
    "restores (local)",
    "last save",
    "Pn",
    "Pt (s)",
    "remap: left alone",
)


def _status(args: argparse.Namespace) -> int:
    """Exit 1 when the store could not be read (what the pilots' files say is still shown), 0
    otherwise; every warning goes to stderr, the data alone to stdout."""
    cfg = load_config(args)
    data = collect(cfg, args.rms or cfg.agent.rms, args.switches, args.snapshots)
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        _print_tables(_Out(), data)
    for err in data["errors"]:
        print(f"vjob: warning: {err}", file=sys.stderr)
    if any(err.startswith("state store:") for err in data["errors"]):
        print("vjob: error: the state store could not be read (warnings above)", file=sys.stderr)
        return 1
    return 0


def _print_tables(out: _Out, data: dict[str, Any]) -> None:
    if data.get("drained"):
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(data["drained"]["since"]))
        out.print(
            f"DRAINED since {since} by {data['drained']['by']}: vjob preempts nothing (vjob drain --undo)",
            markup=False,
        )
    rows = []
    for v in data["vjobs"]:
        save = f"{v['save_seconds']:.2f} s / {v['save_bytes'] / 2**20:.0f} MiB" if v["save_bytes"] else "-"
        rows.append(
            [
                v["job"],
                _vm_cell(v),
                v["node"],
                ",".join(v["hosts"] or []) or "-",
                ", ".join(v["migrations"]) or "-",
                v["pilot"],
                v["image"],
                str(v["boots"]),
                f"{v['restores']} ({v['local_restores']})",
                save,
                "-" if v["preempt_count"] is None else str(v["preempt_count"]),
                "-" if v["preempted_seconds"] is None else f"{v['preempted_seconds']:.0f}",
                v["remap_skipped"] or "-",
            ]
        )
    _table(out, f"vjobs ({data['rms']})", VJOB_COLUMNS, rows)
    rows = []
    for sw in data["switches"]:
        victims = ", ".join(f"{a['job']}@{a['node']}:{a['state']}" for a in sw["actions"])
        started = [a["started_at"] for a in sw["actions"] if a["started_at"]]
        when = time.strftime("%H:%M:%S", time.localtime(min(started))) if started else "-"
        rows.append([str(sw["id"]), sw["state"], sw["reason"], victims, when])
    _table(out, "recent context switches", ("switch", "state", "why", "victims", "when"), rows)
    rows = []
    for r in data["snapshots"]:
        taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created_at"]))
        size = f"{r['size_bytes'] / 2**20:.1f} MiB"
        rows.append([r["job"], r["vm"], r["kind"], r["node"], size, r["sha256"][:12], taken, r["path"]])
    _table(out, "snapshots (newest first)", ("job", "VM", "kind", "node", "size", "sha256", "taken", "path"), rows)
    dl = data["deadline"]
    if dl["jobs"]:
        fmt = "%Y-%m-%d %H:%M:%S"
        rows = [
            [
                job_id,
                time.strftime(fmt, time.localtime(j["deadline"])),
                "-" if j["x"] is None else f"{j['x']:.3f}",
                "-" if j["predicted_end"] is None else time.strftime(fmt, time.localtime(j["predicted_end"])),
                j["decision"],
            ]
            for job_id, j in sorted(dl["jobs"].items())
        ]
        title = f"deadlines (X = {dl['X']}, {dl['admission']}, failure rate {dl['failure_rate']})"
        _table(out, title, ("job", "deadline", "x", "predicted end", "decision"), rows)
    _print_control(out, data["control"])
    _print_waiting(out, data["waiting"])
    vo = dl["vo_model"]
    if isinstance(vo, dict):
        out.print(
            f"VO model: {vo.get('source')} ({vo.get('observations')} finished jobs observed, "
            f"learned kinds: {', '.join(vo.get('learned') or []) or 'none'}); slowdown given to the hooks "
            f"{vo.get('slowdown')}, base {vo.get('base')}, per neighbour {vo.get('per_neighbour')}",
            markup=False,
        )


def _print_waiting(out: Any, waiting: dict[str, Any]) -> None:
    """The held-back interactive jobs and why (the same text their users read in the RMS)."""
    if not waiting["jobs"]:
        return
    rows = [[str(job_id), str(why)] for job_id, why in sorted(waiting["jobs"].items())]
    _table(out, "interactive jobs held back (as of the agent's last tick)", ("job", "why"), rows)


def _vm_cell(v: dict[str, Any]) -> str:
    """The table's VM column: the pilot's VM, or each VM of a multi-node vjob with its node."""
    if len(v["vms"]) > 1:
        return "\n".join(f"{m['vm']} ({m['node']})" for m in v["vms"])
    return str(v["vm"])


def _print_control(out: Any, ctl: dict[str, Any]) -> None:
    """The control loop's last decision (each vjob's target and why) and its plan."""
    if ctl["at"] is None:
        return
    if (
        not isinstance(ctl["at"], int | float)
        or not isinstance(ctl["overloaded"], dict)
        or not all(isinstance(v, dict) for v in ctl["vjobs"].values())
    ):
        print("vjob: warning: the control loop's status record is not in the shape it writes", file=sys.stderr)
        return
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ctl["at"]))
    plan = ctl["plan"] if isinstance(ctl["plan"], dict) else {}
    rows = [
        [job, str(v.get("state")), str(v.get("target")), str(v.get("why"))]
        for job, v in sorted(ctl["vjobs"].items(), key=lambda kv: kv[1].get("position", 0))
    ]
    _table(out, f"control loop, last step {when} ({ctl['policy']})", ("vjob", "now", "target", "why"), rows)
    for node, why in sorted(ctl["overloaded"].items()):
        out.print(f"overloaded: {node} ({why})", markup=False)
    actions = ", ".join(
        f"{a.get('action')} {a.get('vm')}" + (f" {a.get('from')}→{a.get('to')}" if a.get("action") == "migrate" else "")
        for a in plan.get("actions", [])
    )
    cost = "" if plan.get("cost") is None else f", cost {plan['cost']}"
    switch = "" if plan.get("switch") is None else f", switch {plan['switch']}"
    out.print(
        f"plan: {plan.get('outcome')} ({plan.get('why')}){cost}{switch}" + (f": {actions}" if actions else ""),
        markup=False,
    )
