"""Learning the VO model online (issue 19): the refit's properties, the bounded observation
table on SQLite and PostgreSQL, and the agent's deadline step recording a finished job and
starting from the learned model after a restart."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.deadline import DeadlineKeeper
from agent.status_cmd import read_deadline_status
from devkit.devcluster import DevCluster
from plugins.slurm.adapter import SlurmAdapter
from preemption.deadline import KINDS, VOModel, refit_vo_model
from preemption.deadline.vo_learning import MAX_COLOCATED, MAX_SLOWDOWN, MIN_SAMPLES
from tests.agent_steps import deadline_duty
from tests.services import wait_for
from vjob.config import parse
from vjob.errors import CommandError, ConfigError, InputError
from vjob.model import ClusterView, Job, JobState
from vjob.store import vo_observations
from vjob.store.db import Store
from vjob.store.vo_observations import Observation

PRIOR = VOModel.default()


def _obs(
    slowdown: float, colocated: int = 0, kind: str | None = None, i: int = 0, walltime: float = 1000.0
) -> Observation:
    return Observation(f"{i}", 1e9 + i, kind, colocated, walltime, walltime * 1.1, walltime * slowdown)


def _alone(model: VOModel, kind: str) -> float:
    return model.slowdown(kind)


@settings(max_examples=60, deadline=None)
@given(
    s=st.floats(1.0, MAX_SLOWDOWN),
    colocated=st.lists(st.integers(0, MAX_COLOCATED), min_size=MIN_SAMPLES, max_size=60),
    kind=st.sampled_from([None, *KINDS]),
)
def test_observations_all_at_slowdown_s_give_s(s: float, colocated: list[int], kind: str | None) -> None:
    if len(set(colocated)) == 1:
        colocated = [0] * len(colocated)  # one count > 0 cannot separate base from slope: the prior's is kept
    fitted = refit_vo_model(PRIOR, [_obs(s, n, kind, i) for i, n in enumerate(colocated)])
    for k in KINDS if kind is None else (kind,):
        for n in set(colocated) if len(set(colocated)) == 1 else range(MAX_COLOCATED + 1):
            assert fitted.slowdown(k, (k,) * n) == pytest.approx(s, abs=1e-9)
        assert fitted.meta["samples"][k] == len(colocated)
    assert fitted.source == "learned"


@settings(max_examples=60, deadline=None)
@given(
    s=st.floats(1.0, MAX_SLOWDOWN),
    m=st.integers(MIN_SAMPLES, 80),
    outlier=st.floats(1e-6, 1e12),
    outlier_colocated=st.integers(0, 10_000),
)
def test_one_outlier_cannot_move_the_fit_beyond_its_bound(
    s: float, m: int, outlier: float, outlier_colocated: int
) -> None:
    rows = [_obs(s, 0, None, i) for i in range(m)]
    fitted = refit_vo_model(PRIOR, [*rows, _obs(outlier, 0, None, m)])
    for k in KINDS:
        assert 1.0 <= _alone(fitted, k) <= MAX_SLOWDOWN
        assert abs(_alone(fitted, k) - s) <= (MAX_SLOWDOWN - 1.0) / (m + 1) + 1e-9
    anywhere = refit_vo_model(PRIOR, [*rows, _obs(outlier, outlier_colocated, None, m)])
    for k in KINDS:  # whatever its co-location: alone stays in bounds, each neighbour adds a bounded share
        assert 1.0 <= _alone(anywhere, k) <= MAX_SLOWDOWN
        assert 0.0 <= anywhere.pair[k][k] <= (MAX_SLOWDOWN - 1.0) / MAX_COLOCATED + 1e-12


@given(m=st.integers(0, MIN_SAMPLES - 1), s=st.floats(1.0, MAX_SLOWDOWN))
def test_fewer_than_the_minimum_keeps_the_prior(m: int, s: float) -> None:
    assert refit_vo_model(PRIOR, [_obs(s, 0, None, i) for i in range(m)]) is PRIOR


def test_only_the_observed_kind_is_learned_and_unknown_kinds_are_ignored() -> None:
    rows = [_obs(1.5, 0, "mem", i) for i in range(MIN_SAMPLES)] + [_obs(2.5, 0, "gpu", 100 + i) for i in range(50)]
    fitted = refit_vo_model(PRIOR, rows)
    assert fitted.meta["learned"] == ["mem"]
    assert _alone(fitted, "mem") == pytest.approx(1.5)
    assert fitted.base["cpu"] == PRIOR.base["cpu"] and fitted.pair["io"] == PRIOR.pair["io"]
    assert fitted.pair["mem"]["cpu"] == PRIOR.pair["mem"]["cpu"]  # off-diagonal kept


def test_a_linear_co_location_overhead_is_recovered() -> None:
    rows = [_obs(1.1 + 0.05 * n, n, "io", i) for i, n in enumerate([0, 1, 2, 3] * 6)]
    fitted = refit_vo_model(PRIOR, rows)
    assert fitted.base["io"] == pytest.approx(0.1) and fitted.pair["io"]["io"] == pytest.approx(0.05)


def test_jobs_finishing_early_teach_slowdown_one() -> None:
    """actual / time limit below 1 is clipped to 1: a VM is never faster than bare metal."""
    fitted = refit_vo_model(PRIOR, [_obs(0.3, 0, None, i) for i in range(MIN_SAMPLES)])
    assert all(_alone(fitted, k) == 1.0 for k in KINDS)


def test_bad_refit_parameters_name_the_field() -> None:
    with pytest.raises(InputError, match="min_samples = 0"):
        refit_vo_model(PRIOR, [], min_samples=0)
    with pytest.raises(InputError, match=r"max_slowdown = 0\.5"):
        refit_vo_model(PRIOR, [], max_slowdown=0.5)


# -- the store ---------------------------------------------------------------------------


def test_observations_round_trip_and_a_restart_is_not_recorded_twice(store: Store) -> None:
    rows = [_obs(1.2, i % 3, "cpu" if i % 2 else None, i) for i in range(5)]
    assert all(vo_observations.record(store, o) for o in rows)
    assert not vo_observations.record(store, rows[0])  # the same job end seen again
    assert vo_observations.count(store) == 5
    assert vo_observations.recent(store, 3) == rows[:1:-1][:3]
    assert vo_observations.recent(store) == rows[::-1]


def test_the_table_keeps_only_the_newest_rows(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vo_observations, "MAX_ROWS", 4)
    for i in range(7):
        vo_observations.record(store, _obs(1.1, 0, None, i))
    assert [o.job_id for o in vo_observations.recent(store)] == ["6", "5", "4", "3"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"job_id": "1; rm -rf /"}, "job_id"),
        ({"job_id": "x" * 65}, "job_id"),
        ({"kind": "CPU!"}, "kind"),
        ({"colocated": -1}, "colocated"),
        ({"colocated": True}, "colocated"),
        ({"walltime_s": 0.0}, "walltime_s"),
        ({"actual_s": float("nan")}, "actual_s"),
        ({"predicted_s": 1e12}, "predicted_s"),
        ({"actual_s": "100"}, "actual_s"),
        ({"finished_at": float("inf")}, "finished_at"),
    ],
)
def test_hostile_observations_are_refused_naming_the_field(change: dict[str, object], field: str) -> None:
    good = _obs(1.2)
    bad = Observation(**{**{f: getattr(good, f) for f in Observation.__dataclass_fields__}, **change})  # type: ignore[arg-type]
    with pytest.raises(InputError, match=f"{field} = "):
        vo_observations.validate(bad)


# -- the agent's deadline step -------------------------------------------------------------


def _keeper(tmp_path: Path) -> DeadlineKeeper:
    cfg = parse(
        {
            "data_dir": str(tmp_path / "state"),
            "deadline": {"admission": "static", "threshold_file": str(tmp_path / "thr")},
        }
    )
    return DeadlineKeeper(cfg, "slurm")


def _view(*jobs: Job) -> ClusterView:
    return ClusterView(now=time.time(), jobs=jobs)


class _FinishedJobs:
    """The RMS's answer for jobs that left the view (Slurm: `scontrol show job` until
    MinJobAge); the step acts on nothing here (act=False)."""

    def __init__(self, *finished: Job) -> None:
        self.finished = {j.id: j for j in finished}

    def job(self, job_id: str) -> Job:
        return self.finished[job_id]


def test_the_agent_records_finished_jobs_refits_and_restarts_from_the_learned_model(
    store: Store, tmp_path: Path
) -> None:
    keeper = _keeper(tmp_path)
    prior_slowdown = keeper.slowdown
    t0 = time.time() - 10_000
    n = MIN_SAMPLES + 2  # one cancelled, one purged by the RMS: MIN_SAMPLES observations
    running = [
        Job(
            id=str(i),
            user="u",
            state=JobState.RUNNING,
            walltime=1000.0,
            start_time=t0,
            allocated_nodes=(f"n{i // 2}" if i < n - 2 else f"solo{i}",),
        )
        for i in range(n)
    ]
    deadline_duty(keeper, _view(*running), _FinishedJobs(), act=False, store=store)  # type: ignore[arg-type]
    assert set(keeper.watched) == {j.id for j in running}
    assert keeper.watched["0"] == (pytest.approx(1000.0 * prior_slowdown), 1)  # n0 shared by jobs 0 and 1
    done = [
        Job(
            id=j.id,
            user="u",
            state=JobState.COMPLETED,
            walltime=1000.0,
            start_time=t0,
            end_time=t0 + 1400.0,
            allocated_nodes=j.allocated_nodes,
        )
        for j in running
    ]
    done[-1] = Job(
        id=done[-1].id, user="u", state=JobState.CANCELLED, walltime=1000.0, start_time=t0, end_time=t0 + 5.0
    )
    deadline_duty(keeper, _view(), _FinishedJobs(*done[1:]), act=False, store=store)  # type: ignore[arg-type]
    assert vo_observations.count(store) == n - 2  # the cancelled one ran no whole job, job 0 unknown
    assert not keeper.watched
    rows = {o.job_id: o for o in vo_observations.recent(store)}
    row = rows[str(n - 2)]  # alone on its node
    assert (row.actual_s, row.walltime_s, row.colocated, row.kind) == (1400.0, 1000.0, 0, None)
    assert rows["1"].colocated == 1  # shared n0 with job 0
    assert row.predicted_s == pytest.approx(1000.0 * prior_slowdown)
    assert keeper.vo.source == "learned"
    assert keeper.slowdown == pytest.approx(1.4)  # co-located with one or alone, all 1.4: slope 0
    errors: list[str] = []
    shown = read_deadline_status(keeper.cfg, errors)["vo_model"]  # what `vjob status` prints
    assert not errors
    assert shown["source"] == "learned" and shown["observations"] == n - 2
    assert shown["slowdown"] == pytest.approx(1.4) and shown["learned"] == list(KINDS)

    restarted = _keeper(tmp_path)
    assert restarted.vo.source == "default"
    deadline_duty(restarted, _view(), _FinishedJobs(), act=False, store=store)  # type: ignore[arg-type]
    assert restarted.vo.source == "learned" and restarted.slowdown == pytest.approx(keeper.slowdown)
    assert len(restarted.observations) == n - 2


def test_without_enough_observations_the_agent_keeps_the_prior(store: Store, tmp_path: Path) -> None:
    keeper = _keeper(tmp_path)
    t0 = time.time() - 100
    job = Job(id="7", user="u", state=JobState.RUNNING, walltime=50.0, start_time=t0)
    deadline_duty(keeper, _view(job), _FinishedJobs(), act=False, store=store)  # type: ignore[arg-type]
    end = Job(id="7", user="u", state=JobState.COMPLETED, walltime=50.0, start_time=t0, end_time=t0 + 60.0)
    deadline_duty(keeper, _view(), _FinishedJobs(end), act=False, store=store)  # type: ignore[arg-type]
    assert vo_observations.count(store) == 1
    assert keeper.vo is keeper.prior


def test_a_finished_job_looked_up_also_moves_the_adaptive_threshold(tmp_path: Path) -> None:
    """The view never holds finished jobs; the lookup feeds the outcome to X's learning too."""
    cfg = parse(
        {
            "data_dir": str(tmp_path),
            "deadline": {"admission": "adaptive", "static_x": 0.5, "threshold_file": str(tmp_path / "t")},
        }
    )
    keeper = DeadlineKeeper(cfg, "slurm")
    t0 = time.time() - 500
    job = Job(id="9", user="u", state=JobState.RUNNING, walltime=100.0, start_time=t0, deadline=t0 + 200)
    deadline_duty(keeper, _view(job), _FinishedJobs(), act=False)  # type: ignore[arg-type]
    x0 = keeper.x
    late = Job(
        id="9", user="u", state=JobState.COMPLETED, walltime=100.0, start_time=t0, end_time=t0 + 300, deadline=t0 + 200
    )
    deadline_duty(keeper, _view(), _FinishedJobs(late), act=False)  # type: ignore[arg-type]
    assert list(keeper.outcomes) == [False] and keeper.x is not None and x0 is not None and keeper.x < x0
    assert len(keeper.observations) == 1  # no store: kept in memory only


@pytest.mark.slurm
def test_a_real_agent_tick_records_a_finished_slurm_job(
    slurm_cluster: DevCluster, slurm_adapter: SlurmAdapter, tmp_path: Path
) -> None:
    """Live: a watched job leaves squeue's view when it ends; the next tick looks it up
    (`scontrol show job`) and records its time limit, predicted and actual run time — and the
    kind it declared in its comment (a job with a deadline: `vjob:kind=cpu`)."""
    cfg = parse(
        {
            "data_dir": str(tmp_path),
            "slurm": {"conf": str(slurm_cluster.conf)},
            "deadline": {"admission": "static", "threshold_file": str(tmp_path / "threshold")},
        }
    )
    store = Store(cfg.database_url)
    store.upgrade()
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--output=/dev/null",
            "--job-name=vjobvo",
            "--time=1",
            f"--comment=vjob:deadline={int(time.time()) + 3600},vjob:kind=cpu",
        ],
        input="#!/bin/sh\nsleep 3\n",
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", **slurm_cluster.env},
    )
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    try:
        keeper = DeadlineKeeper(cfg, "slurm")
        wait_for(
            lambda: any(j.id == job_id for j in slurm_adapter.jobs() if j.state is JobState.RUNNING), 60, "running"
        )
        deadline_duty(
            keeper,
            ClusterView(now=time.time(), jobs=tuple(slurm_adapter.jobs())),
            slurm_adapter,
            act=False,
            store=store,
        )
        assert job_id in keeper.watched
        wait_for(lambda: all(j.id != job_id for j in slurm_adapter.jobs()), 60, "the job finished")
        deadline_duty(
            keeper,
            ClusterView(now=time.time(), jobs=tuple(slurm_adapter.jobs())),
            slurm_adapter,
            act=False,
            store=store,
        )
        rows = [o for o in vo_observations.recent(store) if o.job_id == job_id]
        assert len(rows) == 1, rows
        assert rows[0].walltime_s == 60 and 2.0 <= rows[0].actual_s <= 30.0
        assert rows[0].kind == "cpu" and rows[0].predicted_s == pytest.approx(60 * keeper.prior.slowdown("cpu"))
        assert job_id not in keeper.watched
    finally:
        store.close()
        try:
            slurm_adapter.cancel(job_id)
        except CommandError:
            pass


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("vo_min_samples", 0),
        ("vo_min_samples", "many"),
        ("vo_max_slowdown", 0.5),
        ("vo_max_slowdown", 1e9),
        ("vo_observations", 0),
        ("vo_observations", 5001),
        ("checkpoint_s", -1),
    ],
)
def test_a_bad_learning_bound_is_refused_naming_the_field_and_value(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"deadline\.{key} = {re.escape(repr(value))}"):
        parse({"deadline": {key: value}})


def test_the_learning_bounds_come_from_the_configuration(tmp_path: Path) -> None:
    """[deadline] vo_min_samples, vo_max_slowdown and vo_observations replace the built-in 20,
    3 and 1,000: three jobs suffice, each clipped to 1.5, and only the newest 3 count."""
    cfg = parse(
        {
            "data_dir": str(tmp_path / "state"),
            "deadline": {
                "admission": "static",
                "threshold_file": str(tmp_path / "thr"),
                "vo_min_samples": 3,
                "vo_max_slowdown": 1.5,
                "vo_observations": 3,
            },
        }
    )
    keeper = DeadlineKeeper(cfg, "slurm")
    t0 = time.time() - 10_000
    ran = {"1": 1100.0, "2": 1300.0, "3": 5000.0, "4": 1200.0}  # job 1 drops out of the newest 3
    for job_id, actual in ran.items():
        job = Job(id=job_id, user="u", state=JobState.RUNNING, walltime=1000.0, start_time=t0)
        deadline_duty(keeper, _view(job), _FinishedJobs(), act=False)  # type: ignore[arg-type]
        end = Job(id=job_id, user="u", state=JobState.COMPLETED, walltime=1000.0, start_time=t0, end_time=t0 + actual)
        deadline_duty(keeper, _view(), _FinishedJobs(end), act=False)  # type: ignore[arg-type]
        if job_id == "2":
            assert keeper.vo is keeper.prior  # two observations: fewer than vo_min_samples = 3
    assert [o.job_id for o in keeper.observations] == ["2", "3", "4"]
    assert keeper.vo.source == "learned" and keeper.vo.meta["max_slowdown"] == 1.5
    assert keeper.slowdown == pytest.approx((1.3 + 1.5 + 1.2) / 3)  # 5000 / 1000 clipped to 1.5
