"""Properties of the deadline policies (x-factor, thresholds, continuation, VO fit, training)."""

from __future__ import annotations

import json
import math
import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preemption.deadline import (
    KINDS,
    Bounds,
    Continuation,
    VOModel,
    adaptive_threshold,
    admit,
    cdf_threshold,
    continuation,
    failure_rate,
    fit_training,
    fit_vo_model,
    predicted_remaining,
    x_factor,
)
from preemption.deadline.threshold_file import read_threshold, write_threshold
from vjob.errors import InputError

SETTINGS = settings(max_examples=200, deadline=None)
rates = st.floats(0, 1)
xs = st.floats(-5, 5)


@st.composite
def bounds(draw: st.DrawFn) -> Bounds:
    low = draw(st.floats(-1, 1))
    return Bounds(low, low + draw(st.floats(0, 2)))


@SETTINGS
@given(bounds(), st.floats(-3, 3), rates, rates, st.floats(0, 1))
def test_adaptive_x_stays_within_its_bounds(b, current, target, measured, dx):
    x = adaptive_threshold(current, target=target, measured=measured, delta_x=dx, bounds=b)
    assert b.low <= x <= b.high


@SETTINGS
@given(bounds(), st.data(), rates, st.floats(0, 1))
def test_adaptive_x_does_not_move_when_the_failure_rate_is_on_target(b, data, target, dx):
    current = data.draw(st.floats(b.low, b.high))
    assert adaptive_threshold(current, target=target, measured=target, delta_x=dx, bounds=b) == current


@SETTINGS
@given(bounds(), st.data(), rates, rates, st.floats(0.001, 1))
def test_adaptive_x_moves_down_on_more_failures_and_up_on_fewer(b, data, target, measured, dx):
    current = data.draw(st.floats(b.low, b.high))
    x = adaptive_threshold(current, target=target, measured=measured, delta_x=dx, bounds=b)
    if measured > target:
        assert x <= current
    elif measured < target:
        assert x >= current
    # the step is Δx·|F_target − F_measured| unless a bound stops it
    assert abs(x - current) <= dx * abs(target - measured) + 1e-12
    if b.low + 1e-9 < x < b.high - 1e-9:
        assert math.isclose(abs(x - current), dx * abs(target - measured), abs_tol=1e-12)


def test_adaptive_refuses_rates_outside_0_1():
    with pytest.raises(InputError, match=r"measured = 1\.5"):
        adaptive_threshold(0.5, target=0.1, measured=1.5, delta_x=0.1, bounds=Bounds(0, 1))
    with pytest.raises(InputError, match=r"x_min = 0\.9, x_max = 0\.1"):
        Bounds(0.9, 0.1)


@SETTINGS
@given(st.floats(0, 1e7), st.floats(-1e7, 1e7))
def test_x_factor_sign_says_late_or_on_time(remaining, ttd):
    x = x_factor(remaining, ttd)
    eff = max(remaining, 1.0)
    assert (x < 0) == (ttd > eff)
    if ttd >= 0:
        assert x <= 1
    elif -ttd > 1e-9 * eff:
        assert x > 1


def test_x_factor_values():
    assert x_factor(3600, 3000) == pytest.approx(600 / 3600)
    assert x_factor(100, 200) == -1.0
    with pytest.raises(InputError, match="remaining_s = nan"):
        x_factor(float("nan"), 10)


def test_admit_examples():
    """The paper's rule on numbers: a job just in time (x = 0) passes X = 0.1; one projected
    to end 20 % of its remaining time late (x = 0.2) does not; x = X is refused (accept while
    x < X); no threshold (admission off) accepts even a hopeless job."""
    assert admit(0.0, 0.1) and admit(-3.0, -2.5)
    assert not admit(0.2, 0.1) and not admit(0.1, 0.1) and not admit(-2.5, -2.5)
    assert admit(1e9, None) and admit(x_factor(100, -1e6), None)


@SETTINGS
@given(xs, xs, xs)
def test_admit_is_monotone_in_lateness_and_in_the_threshold(x, y, threshold):
    """A job later than an admitted one may be refused, never the reverse; a higher threshold
    admits everything a lower one does."""
    lo, hi = sorted((x, y))
    assert admit(hi, threshold) <= admit(lo, threshold)
    assert admit(x, min(threshold, y)) <= admit(x, max(threshold, y))
    assert not admit(threshold, threshold)


@SETTINGS
@given(xs, st.one_of(st.none(), xs), st.sampled_from(["cancel", "checkpoint"]), st.booleans())
def test_continuation_acts_only_over_the_threshold(x, threshold, action, elsewhere):
    c = continuation(x, threshold, action=action, can_meet_elsewhere=elsewhere)
    if threshold is None or x < threshold:
        assert c is Continuation.CONTINUE
    elif action == "checkpoint" and elsewhere:
        assert c is Continuation.CHECKPOINT
    else:
        assert c is Continuation.CANCEL


def test_continuation_names_a_bad_action():
    with pytest.raises(InputError, match="'kill'"):
        continuation(1.0, 0.5, action="kill", can_meet_elsewhere=True)


@SETTINGS
@given(st.lists(xs, max_size=50), st.floats(0.01, 1), bounds(), xs)
def test_cdf_threshold_keeps_the_chosen_share_of_past_jobs_successful(headrooms, p, b, default):
    x = cdf_threshold(headrooms, probability=p, bounds=b, default=default)
    assert b.low <= x <= b.high
    if not headrooms:
        assert x == b.clip(default)
    elif b.low < x < b.high:
        # at x = X at least p of the past jobs had room (success iff x <= headroom) ...
        assert sum(1 for h in headrooms if h >= x) >= p * len(headrooms) - 1e-9
        # ... and X is the largest such value: one step higher and fewer than p would have
        higher = [h for h in headrooms if h > x]
        if higher:
            assert sum(1 for h in headrooms if h >= min(higher)) < p * len(headrooms) + 1e-9
        assert x in headrooms


@SETTINGS
@given(st.lists(xs, min_size=1, max_size=50), st.floats(0.01, 0.98), st.floats(0.01, 0.98))
def test_cdf_threshold_is_lower_for_a_higher_probability(headrooms, p, q):
    b = Bounds(-10, 10)
    lo, hi = sorted((p, q))
    assert cdf_threshold(headrooms, probability=hi, bounds=b, default=0) <= cdf_threshold(
        headrooms, probability=lo, bounds=b, default=0
    )


def test_failure_rate_examples():
    """True = the job met its deadline. No history is no failure (X is not moved on nothing)."""
    assert failure_rate([]) == 0.0
    assert failure_rate([True, True, True, False]) == 0.25
    assert failure_rate([False]) == 1.0 and failure_rate(iter([True, False])) == 0.5


@SETTINGS
@given(st.lists(st.booleans(), max_size=100), st.randoms(use_true_random=False))
def test_failure_rate_is_a_share_that_moves_with_each_outcome(outcomes, rnd):
    """A share in [0, 1], blind to the order, raised by one more failure and lowered by one more
    success (both strictly, unless already at the end of the scale)."""
    f = failure_rate(outcomes)
    assert 0.0 <= f <= 1.0
    shuffled = list(outcomes)
    rnd.shuffle(shuffled)
    assert math.isclose(failure_rate(shuffled), f)
    worse, better = failure_rate([*outcomes, False]), failure_rate([*outcomes, True])
    assert worse > f or f == 1.0
    assert better < f or f == 0.0
    assert better <= f <= worse


@SETTINGS
@given(st.floats(1, 1e6), st.floats(0, 2e6), st.floats(0.5, 3))
def test_predicted_remaining_never_says_done_while_running(estimate, done, slowdown):
    r = predicted_remaining(estimate, done, slowdown)
    if done >= estimate:
        assert math.isclose(r, 0.05 * estimate * slowdown, rel_tol=1e-9)
    else:
        assert math.isclose(r, (estimate - done) * slowdown, rel_tol=1e-9)


def test_vo_model_default_and_physical():
    vo = VOModel.default()
    assert vo.slowdown("cpu") == pytest.approx(1.02)
    # memory-bound beside memory-bound suffers more than beside a CPU-bound guest
    assert vo.slowdown("mem", ["mem"]) > vo.slowdown("mem", ["cpu"])
    assert all(VOModel.physical().slowdown(k, KINDS) == 1.0 for k in KINDS)
    with pytest.raises(InputError, match="'gpu'"):
        vo.slowdown("gpu")
    assert VOModel.from_dict(vo.to_dict()) == vo


@SETTINGS
@given(
    st.sampled_from(KINDS),
    st.floats(0, 0.5),
    st.floats(0, 0.3),
    st.floats(1, 100),
)
def test_fit_recovers_a_linear_overhead(kind, base, per, bare):
    rows = [{"kind": kind, "colocated": n, "bare_s": bare, "vm_s": bare * (1 + base + per * n)} for n in range(4)]
    vo = fit_vo_model(rows)
    assert vo.base[kind] == pytest.approx(base, abs=1e-9)
    assert vo.pair[kind][kind] == pytest.approx(per, abs=1e-9)
    others = [k for k in KINDS if k != kind]
    assert sorted(vo.meta["defaulted"]) == sorted(others)


def test_fit_names_the_bad_row():
    with pytest.raises(InputError, match="row 1"):
        fit_vo_model([{"kind": "cpu", "colocated": 0, "bare_s": 1, "vm_s": 1.1}, {"kind": "cpu", "colocated": 1}])
    with pytest.raises(InputError, match="row 0: colocated = -1"):
        fit_vo_model([{"kind": "cpu", "colocated": -1, "bare_s": 1, "vm_s": 1}])


def test_training_keeps_the_best_and_the_first_of_ties():
    seen = []

    def evaluate(p):
        seen.append(p)
        return -((p["delta_x"] - 0.05) ** 2) - (p["target"] - 0.1) ** 2

    result = fit_training(
        evaluate,
        {"delta_x": [0.01, 0.05, 0.1], "target": [0.05, 0.1, 0.2], "x_min": [0.1], "x_max": [0.9]},
        valid=lambda p: p["x_min"] < p["x_max"],
    )
    assert result.best == {"delta_x": 0.05, "target": 0.1, "x_min": 0.1, "x_max": 0.9}
    assert len(seen) == 9 == len(result.tried)
    assert "delta_x = 0.05" in result.toml() and result.toml().startswith("[deadline]")
    with pytest.raises(InputError, match="no valid combination"):
        fit_training(evaluate, {"delta_x": [0.1], "target": [0.1]}, valid=lambda p: False)


def test_a_vo_model_loads_from_a_model_or_from_the_bench_output(tmp_path):
    bench = tmp_path / "bench.json"
    rows = [{"kind": "mem", "colocated": n, "bare_s": 2.0, "vm_s": 2.0 * (1.1 + 0.05 * n)} for n in (0, 1, 3)]
    bench.write_text(json.dumps({"accel": "tcg", "measurements": rows}))
    fitted = VOModel.load(bench)
    assert fitted.base["mem"] == pytest.approx(0.1) and fitted.pair["mem"]["mem"] == pytest.approx(0.05)
    model = tmp_path / "model.json"
    model.write_text(json.dumps(fitted.to_dict()))
    assert VOModel.load(model).pair == fitted.pair
    model.write_text('{"base": {"cpu": 0.1}}')
    with pytest.raises(InputError, match=r"model\.json"):
        VOModel.load(model)


def test_the_threshold_file_carries_its_staleness_limit(tmp_path) -> None:
    """The hooks parse no configuration: the agent writes [deadline] stale_after_s into the
    file and the readers (this one, job_submit.lua, the PBS hook) take the limit from there."""
    path = tmp_path / "t"
    write_threshold(path, 0.25, 1.1, 10_000, stale_after_s=900.5)
    assert path.read_text() == "x=0.250000 slowdown=1.100000 at=10000 stale=901\n"
    assert read_threshold(path, now=10_900) is not None and read_threshold(path, now=10_902) is None
    path.write_text("x=0.250000 slowdown=1.100000 at=10000\n")  # an older agent: 600 s
    assert read_threshold(path, now=10_600) is not None and read_threshold(path, now=10_601) is None
    for bad in ("stale=0", "stale=99999", "stale=", "stale=-5"):
        path.write_text(f"x=0.250000 slowdown=1.100000 at=10000 {bad}\n")
        assert read_threshold(path, now=10_001) is None, bad
    with pytest.raises(InputError, match="stale_after_s = 0"):
        write_threshold(path, 0.25, 1.1, 10_000, stale_after_s=0)


def test_a_file_planted_under_the_old_temporary_name_is_not_published(tmp_path) -> None:
    """Issue 39 item 13: the temporary name was `.NAME.<pid>.tmp`, opened without O_EXCL, so a
    file planted there (by a user who can write the directory) was written and renamed into
    place, still owned by its planter, who could then rewrite X. Now the name is random and
    created exclusively: the planted file is left alone, the published one is root's own."""
    path = tmp_path / "vjob-deadline.threshold"
    planted = tmp_path / f".{path.name}.{os.getpid()}.tmp"
    planted.write_text("x=9.000000 slowdown=1.000000 at=10000\n")
    os.chown(planted, 65534, 65534)
    planted.chmod(0o666)
    write_threshold(path, 0.25, 1.1, 10_000)
    published, kept = path.stat(), planted.stat()
    assert published.st_ino != kept.st_ino and published.st_uid == os.getuid()
    assert stat.S_IMODE(published.st_mode) == 0o644
    assert planted.read_text().startswith("x=9.")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, planted.name])  # no temporary left
