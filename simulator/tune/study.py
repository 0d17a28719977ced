"""A study in an SQL database that any number of workers join (Optuna's RDB storage).

Why Optuna's storage and not a queue of our own: the study *is* the queue. Each worker asks
the database for the next trial, so a Slurm array task, a PBS -J subjob or an OAR array job
needs nothing but the database URL; a trial's row is claimed by exactly one worker. A worker
killed mid-trial stops beating its heartbeat: the next worker to ask marks that trial FAIL
and enqueues it again once (RetryFailedTrialCallback), so the study stays usable.
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.study import MaxTrialsCallback
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from simulator.tune.space import Space, directions
from simulator.tune.trials import Spec, evaluate, parts
from vjob.errors import InputError
from vjob.progress import Progress
from vjob.secrets import mask_url

optuna.logging.set_verbosity(optuna.logging.WARNING)  # our progress says it once, not a line per trial
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

_RETRY = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or optuna.storages.RetryFailedTrialCallback
"""Re-enqueues a trial whose worker died, once (Optuna >= 4.9 renamed it)."""

STORAGE_ENV = "VJOB_TUNE_STORAGE"
"""The study database URL for workers: array tasks inherit it, so a password never sits in argv."""
TRAIN_KEYS = ("utilization", "makespan_s", "preemptions", "jobs")


def storage_url(given: str | None, data_dir: Path) -> str:
    """--storage, else $VJOB_TUNE_STORAGE, else SQLite at <data_dir>/tune.sqlite."""
    url = given or os.environ.get(STORAGE_ENV) or f"sqlite:///{data_dir / 'tune.sqlite'}"
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise InputError(f"--storage {mask_url(url)!r}: not an SQLAlchemy URL (e.g. sqlite:///tune.sqlite)") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    if parsed.drivername == "postgresql":
        url = parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    return url


def storage(url: str, heartbeat_s: int | None = None) -> RDBStorage:
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 120}}
    if heartbeat_s:
        kwargs.update(
            heartbeat_interval=heartbeat_s,
            grace_period=max(2 * heartbeat_s, heartbeat_s + 2),
            heartbeat_stale_trial_callback=_RETRY(max_retry=1),
        )
    return RDBStorage(url, **kwargs)


def sampler(name: str, trials: int, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, min(10, trials // 4)))
    return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, trials // 4)))


def create(
    url: str, name: str, spec: Spec, trials: int, sampler_name: str, *, defaults: dict[str, float] | None = None
) -> optuna.Study:
    """Create study `name`, or take it up again when it exists with the same set-up
    (resumable: `trials` is then the new total)."""
    store = storage(url)
    try:
        existing = optuna.load_study(study_name=name, storage=store)
    except KeyError:
        existing = None
    if existing is not None:
        old = existing.user_attrs.get("spec")
        if old != spec.to_json():
            diff = sorted(k for k in spec.to_json() if (old or {}).get(k) != spec.to_json()[k])
            raise InputError(
                f"--study {name}: exists in {mask_url(url)} with another set-up ({', '.join(diff)} differ): "
                "resume it with the same options, or name a new study"
            )
        existing.set_user_attr("trials", trials)
        return existing
    study = optuna.create_study(study_name=name, storage=store, directions=directions(spec.objectives))
    study.set_user_attr("spec", spec.to_json())
    study.set_user_attr("trials", trials)
    study.set_user_attr("sampler", sampler_name)
    if defaults is not None:
        study.enqueue_trial(defaults, user_attrs={"origin": "[priority] / [scheduling] as configured"})
    return study


def load(url: str, name: str, heartbeat_s: int | None = None) -> tuple[optuna.Study, Spec]:
    store = storage(url, heartbeat_s)
    try:
        summaries = {s.study_name for s in optuna.get_all_study_summaries(store)}
    except Exception as exc:  # noqa: BLE001 - any driver error: one clear line
        raise InputError(f"--storage {mask_url(url)}: cannot read studies: {str(exc).splitlines()[0]}") from None
    if name not in summaries:
        known = ", ".join(sorted(summaries)) or "none"
        raise InputError(f"study {name!r}: not in {mask_url(url)} (studies there: {known})")
    attrs = optuna.load_study(study_name=name, storage=store).user_attrs
    trials = int(attrs.get("trials", 0))
    study = optuna.load_study(
        study_name=name, storage=store, sampler=sampler(str(attrs.get("sampler", "nsga2")), trials, None)
    )
    if "spec" not in attrs:
        raise InputError(f"study {name!r} in {mask_url(url)} was not made by `vjob tune run` (no set-up stored)")
    return study, Spec.from_json(attrs["spec"])


def complete(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def describe_best(study: optuna.Study, spec: Spec) -> str:
    """`front N; best a X, b Y`: the Pareto front's size and each objective's best value."""
    done = complete(study)
    if not done:
        return "no trial complete yet"
    parts_ = []
    for i, (name, way) in enumerate(zip(spec.objectives, directions(spec.objectives), strict=True)):
        vals = [t.values[i] for t in done]
        parts_.append(f"{name} {(max if way == 'maximize' else min)(vals):.4g}")
    return f"front {len(study.best_trials)}; best {', '.join(parts_)}"


def work(url: str, name: str, *, heartbeat_s: int | None = 30, show: bool = True) -> list[int]:
    """Run trials of study `name` until it holds its target of complete trials; returns the
    numbers of the trials this worker ran."""
    study, spec = load(url, name, heartbeat_s)
    target = int(study.user_attrs.get("trials", 0))
    space = Space(
        {k: (float(v[0]), float(v[1])) for k, v in spec.bounds.items()},
        {k: tuple(v) for k, v in spec.choices.items()},
    )
    parts(spec)  # read and split the trace once, before the first trial
    worker = f"{socket.gethostname()}:{os.getpid()}" + (
        f":task{os.environ['SLURM_ARRAY_TASK_ID']}" if "SLURM_ARRAY_TASK_ID" in os.environ else ""
    )
    ran: list[int] = []

    def objective(trial: optuna.Trial) -> list[float]:
        ran.append(trial.number)
        trial.set_user_attr("worker", worker)
        started = time.perf_counter()
        doc = evaluate(spec, space.suggest(trial))
        trial.set_user_attr("train", {k: doc.get(k) for k in TRAIN_KEYS})
        trial.set_user_attr("seconds", time.perf_counter() - started)
        return [doc["objectives"][n] for n in spec.objectives]  # a NaN fails the trial (no such jobs)

    before = len(complete(study))
    if target - before <= 0:
        return ran
    with Progress(target - before, f"tune {name}", live=None if show else False) as progress:

        def report(study: optuna.Study, _trial: FrozenTrial) -> None:
            now = len(complete(study))
            progress.relabel(f"tune {name} ({now}/{target} complete; {describe_best(study, spec)})")
            progress.advance(max(0, now - before - progress.done))

        study.optimize(
            objective,
            n_trials=target,
            callbacks=[MaxTrialsCallback(target, states=(TrialState.COMPLETE,)), report],
            gc_after_trial=False,
        )
    return ran
