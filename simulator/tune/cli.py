"""`vjob tune run | worker | show | apply`: find a site's weights on its own trace.

Why this module imports no Optuna: `vjob tune --help` and the other commands must work on an
install without the `tune` extra; the study code is imported when an action runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from vjob.cli import load_config, require_extra
from vjob.errors import InputError
from vjob.secrets import mask_url

_STUDY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

EPILOG = """\
examples:
  vjob tune run --trace site.swf --nodes 1056 --interactive-frac 0.2 --objectives \\
      interactive_response,batch_slowdown --trials 200 --study site1
  vjob tune run ... --study site1 --storage postgresql://tune:PW@db/tune --submit slurm --array 8
  vjob tune show site1 --png site1.png
  vjob tune apply site1 --trial 17 --config /etc/vjob/vjob.toml

The study lives in --storage (default $VJOB_TUNE_STORAGE, else SQLite <data_dir>/tune.sqlite);
docs/tune.md explains the split, the objectives and the array workers."""


def register(sub: Any) -> None:
    """Add `vjob tune` and its actions (run, worker, show, apply) to the `vjob` parser."""
    p = sub.add_parser(
        "tune",
        help="tune the site's scheduling policy (vjob knobs, or UBIS weights) on its trace (Optuna)",
        description="Multi-objective search (Optuna, NSGA-II or TPE) of what the site's policy reads "
        "([scheduling] policy: vjob's cap, slack, preemption bound and reserve; ubis's weights and cap) "
        "over the simulator, trained on the first part of a trace and reported on the held-back rest.",
        epilog=EPILOG,
    )
    tsub = p.add_subparsers(dest="tune_command", metavar="ACTION", required=True)
    _add_run(tsub)
    _add_worker(tsub)
    _add_show(tsub)
    _add_apply(tsub)


def _add_run(tsub: Any) -> None:
    """`vjob tune run`: the set-up of a study (trace, objectives, search) and where its workers run."""
    run = tsub.add_parser(
        "run",
        help="create or resume a study and run its trials",
        epilog=EPILOG,
        description="Create the study (or resume it with the same set-up) and run trials until "
        "it holds --trials complete ones, here or as a Slurm job array.",
    )
    run.add_argument("--trace", metavar="FILE", required=True, help="SWF (plain or .gz) or Torque accounting log")
    run.add_argument("--nodes", metavar="N", type=int, required=True, help="machine size (nodes)")
    run.add_argument("--study", metavar="NAME", required=True, help="study name (letters, digits, . _ -)")
    run.add_argument("--storage", metavar="URL", default=None, help="SQLAlchemy URL of the study database (see below)")
    run.add_argument("--trials", metavar="N", type=int, default=50, help="complete trials the study ends with (count)")
    run.add_argument(
        "--objectives",
        metavar="LIST",
        default=None,
        help="comma list (default [tune] objectives): "
        "interactive_response, interactive_wait, batch_response, batch_slowdown, "
        "large_batch_response, admitted_interactive_wait, utilization",
    )
    run.add_argument(
        "--search",
        metavar="LIST",
        default=None,
        help="parameters searched, comma list (default [tune] search): "
        "w1..w7 or usage..interactive, interactive_cap, head_slack_s, max_preemptions, "
        "interactive_reserve_nodes, tier_order (vjob: submit, ubis or ubis-interactive); "
        "default: all the policy reads",
    )
    run.add_argument(
        "--bounds", metavar="RANGES", default=None, help="name=low:high,... over [tune] bounds (e.g. w3=0:0.3)"
    )
    run.add_argument(
        "--policy",
        choices=("ubis", "vjob"),
        default=None,
        help="policy tuned and later applied (default [tune] policy, else [scheduling] policy)",
    )
    run.add_argument("--sampler", choices=("nsga2", "tpe"), default=None, help="Optuna sampler (default [tune])")
    run.add_argument(
        "--train-fraction", metavar="FRACTION", type=float, default=None, help="share of the span tuned on (0..1)"
    )
    run.add_argument(
        "--interactive-frac",
        metavar="FRACTION",
        type=float,
        default=0.2,
        help="share of all jobs injected as interactive",
    )
    run.add_argument(
        "--interactive-mean-size", metavar="NODES", type=float, default=100.0, help="Poisson mean of interactive sizes"
    )
    run.add_argument("--os-count", metavar="N", type=int, default=2, help="OS images (count)")
    run.add_argument("--cap-mode", choices=("preempt", "hard"), default="preempt", help="as for vjob simulate")
    run.add_argument("--seed", metavar="N", type=int, default=1, help="seed of the set-up (interactive jobs, OS draws)")
    run.add_argument("--max-jobs", metavar="N", type=int, default=None, help="use only the first N trace jobs (count)")
    run.add_argument(
        "--backfill-depth", metavar="N", type=int, default=500, help="queued jobs per backfill pass (count)"
    )
    run.add_argument(
        "--priority-refresh", metavar="SECONDS", type=float, default=0.0, help="ubis: reuse priorities this many s"
    )
    run.add_argument("--lenient", action="store_true", help="skip and count malformed trace lines")
    run.add_argument("--no-defaults", action="store_true", help="do not start with the configured values as trial 0")
    run.add_argument(
        "--heartbeat-s",
        metavar="SECONDS",
        type=int,
        default=30,
        help="worker heartbeat (s); a silent trial fails after 2x",
    )
    run.add_argument(
        "--submit",
        choices=("local", "slurm", "none"),
        default="local",
        help="where the workers run: here, as a Slurm array, or none (create the study only; start "
        "`vjob tune worker` yourself, e.g. as a PBS or OAR array)",
    )
    run.add_argument("--array", metavar="N", type=int, default=4, help="--submit slurm: array tasks (workers)")
    run.add_argument(
        "--time", metavar="LIMIT", default=None, help="--submit slurm: time limit of each task (sbatch --time)"
    )
    run.add_argument("--log-dir", metavar="DIR", default=".", help="--submit slurm: where the tasks write their output")
    run.add_argument("--no-progress", action="store_true", help="plain progress lines even on a terminal")
    run.set_defaults(func=_run)


def _add_worker(tsub: Any) -> None:
    """`vjob tune worker`: what an array task runs (study and database from the environment)."""
    worker = tsub.add_parser(
        "worker",
        help="join a study and run its trials (an array task runs this)",
        description="Run trials of an existing study until it holds its target; the study "
        "and database default to $VJOB_TUNE_STUDY and $VJOB_TUNE_STORAGE.",
        epilog="example (what an array task runs; the study and URL come from the environment):\n"
        "  VJOB_TUNE_STUDY=site1 VJOB_TUNE_STORAGE=postgresql://tune:PW@db/tune vjob tune worker",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    worker.add_argument("--study", metavar="NAME", default=None, help="study name (default $VJOB_TUNE_STUDY)")
    worker.add_argument(
        "--storage", metavar="URL", default=None, help="study database URL (default $VJOB_TUNE_STORAGE)"
    )
    worker.add_argument(
        "--heartbeat-s",
        metavar="SECONDS",
        type=int,
        default=None,
        help="heartbeat (s; default $VJOB_TUNE_HEARTBEAT_S or 30)",
    )
    worker.add_argument("--no-progress", action="store_true", help="plain progress lines")
    worker.set_defaults(func=_worker)


def _add_show(tsub: Any) -> None:
    """`vjob tune show`: the Pareto front replayed on the held-back part."""
    show = tsub.add_parser(
        "show",
        help="the Pareto front on the held-back part, beside the defaults, MMS and UBIS",
        description="Replay the study's Pareto-optimal trials on the held-back part of the trace, "
        "with the configured weights and MMS, and print a table; --png draws it.",
        epilog="example:\n  vjob tune show site1 --png site1.png",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    show.add_argument("study", help="study name")
    show.add_argument("--storage", metavar="URL", default=None, help="study database URL")
    show.add_argument("--png", metavar="FILE", default=None, help="write the front as a PNG here")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.set_defaults(func=_show)


def _add_apply(tsub: Any) -> None:
    """`vjob tune apply`: a trial's values written into vjob.toml."""
    app = tsub.add_parser(
        "apply",
        help="write a trial's values into vjob.toml (validated, rest kept)",
        description="Write the study's policy ([scheduling] policy) and trial N's values (the weights, "
        "cap, vjob knobs it tuned) into the configuration file, keeping every other line as it was; "
        "the result is validated with vjob's own loader before it replaces the file.",
        epilog="example:\n  vjob tune apply site1 --trial 17 --config /etc/vjob/vjob.toml --dry-run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    app.add_argument("study", help="study name")
    app.add_argument("--trial", metavar="N", type=int, required=True, help="trial number (see vjob tune show)")
    app.add_argument("--storage", metavar="URL", default=None, help="study database URL")
    app.add_argument("--dry-run", action="store_true", help="print the new file instead of writing it")
    app.add_argument(
        "--policy",
        choices=("ubis", "vjob"),
        default=None,
        help="the policy you mean to run: refused unless it is the one the study tuned (written as "
        "[scheduling] policy)",
    )
    app.set_defaults(func=_apply)


def _study_name(text: str | None) -> str:
    name = text or os.environ.get("VJOB_TUNE_STUDY") or ""
    if not _STUDY.fullmatch(name):
        raise InputError(f"--study {name[:70]!r}: letters, digits, '.', '_' or '-' (1..64, starting alphanumeric)")
    return name


def _run(args: argparse.Namespace) -> int:
    require_extra("vjob tune", "optuna", "numba")
    from simulator.tune import space as sp  # heavy: pydantic (the [tune] section's model)
    from simulator.tune import study as st  # heavy: optuna
    from simulator.tune.trials import Spec, jobs_per_part  # heavy: pydantic (the configuration)

    cfg = load_config(args)
    name = _study_name(args.study)
    if args.trials < 1:
        raise InputError(f"--trials = {args.trials}: must be >= 1")
    if args.nodes < 1:
        raise InputError(f"--nodes = {args.nodes}: must be >= 1")
    train_fraction = cfg.tune.train_fraction if args.train_fraction is None else args.train_fraction
    if not 0.05 < train_fraction < 1:
        raise InputError(f"--train-fraction = {train_fraction:g}: must be in 0.05..1 (exclusive)")
    objectives = sp.objectives(args.objectives, cfg.tune)
    policy = sp.tuned_policy(args.policy, cfg.tune.policy, cfg.scheduling.policy)
    space = sp.space(args.search, args.bounds, cfg.tune, policy)
    spec = Spec(
        trace=str(Path(args.trace).resolve()),
        nodes=args.nodes,
        objectives=objectives,
        policy=policy,
        interactive_frac=args.interactive_frac,
        interactive_mean_size=args.interactive_mean_size,
        os_count=args.os_count,
        seed=args.seed,
        max_jobs=args.max_jobs,
        cap_mode=args.cap_mode,
        train_fraction=train_fraction,
        lenient=args.lenient,
        backfill_depth=args.backfill_depth,
        priority_refresh_s=args.priority_refresh,
        priority=cfg.priority.model_dump(),
        scheduling=cfg.scheduling.model_dump(),
        bounds={k: [lo, hi] for k, (lo, hi) in space.bounds.items()},
        choices={k: list(v) for k, v in space.choices.items()},
    )
    if not Path(args.trace).exists():
        raise InputError(f"--trace {args.trace}: no such file or directory")
    train, test = jobs_per_part(spec)  # reads and splits the trace: bad input fails here, before any study
    url = st.storage_url(args.storage, cfg.data_path)
    if args.submit == "slurm":  # before the study is created: a refused run leaves no study
        from simulator.tune.submit import require_server_storage  # heavy: optuna

        require_server_storage(url)
    defaults = None if args.no_defaults else _configured(spec, space.bounds, space.choices)
    st.create(url, name, spec, args.trials, args.sampler or cfg.tune.sampler, defaults=defaults)
    print(
        f"study {name}: {train} jobs to tune on, {test} held back; objectives {', '.join(objectives)}; "
        f"searching {', '.join(space.names)}",
        file=sys.stderr,
    )
    if args.submit == "none":
        print(
            f"study {name} ready in {mask_url(url)}: start workers with VJOB_TUNE_STUDY={name} vjob tune worker",
            file=sys.stderr,
        )
        return 0
    if args.submit == "slurm":
        from simulator.tune.submit import submit_slurm  # heavy: optuna

        job = submit_slurm(
            cfg.slurm,
            name,
            url,
            args.array,
            heartbeat_s=args.heartbeat_s,
            log_dir=Path(args.log_dir),
            time_limit=args.time,
        )
        print(job)
        print(
            f"submitted {args.array} workers as Slurm array job {job}; follow with `vjob tune show {name}`",
            file=sys.stderr,
        )
        return 0
    st.work(url, name, heartbeat_s=args.heartbeat_s, show=not args.no_progress)
    study, _ = st.load(url, name)
    print(f"study {name}: {len(st.complete(study))} trials complete; {st.describe_best(study, spec)}", file=sys.stderr)
    return 0


def _configured(
    spec: Any, bounds: dict[str, tuple[float, float]], choices: dict[str, tuple[str, ...]]
) -> dict[str, float | str] | None:
    """The configured values of the searched parameters, when all lie within the bounds."""
    flat = dict(spec.priority["weights"]) | {
        "tier_order": spec.scheduling.get("tier_order", "submit"),
        "interactive_cap": spec.priority["interactive_cap"],
        "head_slack_s": spec.scheduling["head_slack_s"],
        "max_preemptions": spec.scheduling["max_preemptions"],
        "interactive_reserve_nodes": spec.scheduling.get("interactive_reserve_nodes", 0),
    }
    point = {k: flat[k] for k in [*choices, *bounds]}
    if all(lo <= point[k] <= hi for k, (lo, hi) in bounds.items()) and all(point[k] in v for k, v in choices.items()):
        return point
    return None


def _worker(args: argparse.Namespace) -> int:
    require_extra("vjob tune", "optuna", "numba")
    from simulator.tune import study as st  # heavy: optuna

    cfg = load_config(args)
    name = _study_name(args.study)
    url = st.storage_url(args.storage, cfg.data_path)
    heartbeat = args.heartbeat_s or int(os.environ.get("VJOB_TUNE_HEARTBEAT_S", "30") or 30)
    ran = st.work(url, name, heartbeat_s=heartbeat, show=not args.no_progress)
    print(json.dumps({"study": name, "ran": ran}))
    return 0


def _show(args: argparse.Namespace) -> int:
    require_extra("vjob tune", "optuna", "numba", *(("matplotlib",) if args.png else ()))
    from simulator.tune import report  # heavy: optuna
    from simulator.tune import study as st  # heavy: optuna

    cfg = load_config(args)
    name = _study_name(args.study)
    url = st.storage_url(args.storage, cfg.data_path)
    study, spec = st.load(url, name)
    if not st.complete(study):
        raise InputError(f"study {name}: no complete trial yet (run `vjob tune run` or wait for its workers)")
    rows = report.held_back(study, spec, show=not args.json)
    verdict = report.verdicts(rows, spec)
    if args.png:
        report.plot(
            rows, spec, Path(args.png), f"{name}: {Path(spec.trace).name}, held-back {1 - spec.train_fraction:.0%}"
        )
    if args.json:
        print(json.dumps({"study": name, "objectives": spec.objectives, "rows": rows, "verdict": verdict}, indent=2))
        return 0
    _table(name, spec, rows, verdict, args.png)
    return 0


def _table(name: str, spec: Any, rows: list[dict[str, Any]], verdict: dict[str, Any], png: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"study {name}: Pareto front measured on the held-back {1 - spec.train_fraction:.0%}")
    table.add_column("point")
    for o in spec.objectives:
        table.add_column(f"{o}\ntrain / held back", justify="right")
    table.add_column("batch\nresponse (s)", justify="right")
    table.add_column("admitted\ninteractive wait (s)", justify="right")
    table.add_column("beats defaults", justify="center")
    for r in rows:
        cells = [r["name"]]
        for i in range(len(spec.objectives)):
            cells.append(f"{_num(r['train'][i]) if r['train'] else '-'} / {_num(r['test'][i])}")
        cells += [
            _num(r["batch_response"]),
            _num(r["admitted_wait"]),
            "yes" if r["trial"] in verdict["dominate_defaults"] else "",
        ]
        table.add_row(*cells)
    console = Console()
    console.print(table)
    console.print(
        f"front trials better than the defaults on every objective: {verdict['dominate_defaults'] or 'none'}; "
        f"of them no worse than MMS on batch response: {verdict['dominate_defaults_and_batch_le_mms'] or 'none'}"
        + (f"; plot {png}" if png else "")
    )


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"


def _apply(args: argparse.Namespace) -> int:
    require_extra("vjob tune", "optuna")
    from simulator.tune import study as st  # heavy: optuna
    from simulator.tune.toml_edit import apply_file, set_values  # heavy: pydantic (validates the edit)

    path = getattr(args, "config", None)
    if not path:
        raise InputError("vjob tune apply: name the file to write with --config FILE")
    # the file to write is also the configuration read (its data_dir), once it exists
    cfg = load_config(args if Path(path).exists() else argparse.Namespace(config=None, debug=args.debug))
    name = _study_name(args.study)
    url = st.storage_url(args.storage, cfg.data_path)
    study, spec = st.load(url, name)
    trials = {t.number: t for t in st.complete(study)}
    if args.trial not in trials:
        raise InputError(
            f"--trial {args.trial}: not a complete trial of study {name} (complete: {_ranges(sorted(trials))})"
        )
    updates = trial_updates(name, args.trial, trials[args.trial].params, spec.policy, args.policy)
    target = Path(path)
    if args.dry_run:
        old = target.read_text() if target.exists() else ""
        sys.stdout.write(set_values(old, updates))
        return 0
    apply_file(target, updates)
    print(
        f"{target}: trial {args.trial} of {name} written ({', '.join(f'{s}.{k}' for s, k, _ in updates)})",
        file=sys.stderr,
    )
    return 0


def trial_updates(
    study: str, trial: int, params: dict[str, Any], policy: str, asked: str | None = None
) -> list[tuple[str, str, float | int | str]]:
    """The (section, key, value) lines `vjob tune apply` writes for `trial`: `[scheduling]
    policy` = the policy the study measured, then the trial's values. Refused, naming the
    field, when `asked` is another policy (the values were never measured under it) or the
    trial holds a parameter the policy does not read (it would change nothing)."""
    from simulator.tune.config import POLICY_PARAMS  # heavy: pydantic (the [tune] model)
    from simulator.tune.space import INTEGERS, SCHEDULING, WEIGHTS  # heavy: pydantic (the configuration)

    if asked is not None and asked != policy:
        raise InputError(
            f"--policy {asked}: trial {trial} of study {study} was measured under policy {policy}; "
            f"its values say nothing about {asked} (tune a study with --policy {asked})"
        )
    updates: list[tuple[str, str, float | int | str]] = [("scheduling", "policy", policy)]
    for key, value in sorted(params.items()):
        if key not in POLICY_PARAMS.get(policy, ()):
            raise InputError(
                f"trial {trial} of study {study}: parameter {key} = {value!r} is not read by policy {policy} "
                f"(it reads {', '.join(POLICY_PARAMS.get(policy, ()))}); nothing written"
            )
        section = "priority.weights" if key in WEIGHTS else "scheduling" if key in SCHEDULING else "priority"
        if isinstance(value, str):  # a choice (tier_order): the loader's model checks the value
            updates.append((section, key, value))
        else:
            updates.append((section, key, int(value) if key in INTEGERS else float(f"{value:.6g}")))
    return updates


def _ranges(numbers: list[int]) -> str:
    if not numbers:
        return "none"
    return ", ".join(str(n) for n in numbers[:20]) + (" ..." if len(numbers) > 20 else "")
