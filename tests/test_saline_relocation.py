"""Migrate before suspend, the decision alone (Saline paper 3.1.1): no OAR, no libvirt."""

from __future__ import annotations

import pytest

from saline_bew.events import EventKind
from saline_bew.relocation import (
    MARGIN_S,
    MIN_WAIT_S,
    OpenRequest,
    Path,
    Plan,
    Target,
    migrate_estimate_s,
    open_request,
    plan,
    suspend_estimate_s,
    wait_budget,
)


def _plan(**kw: object) -> Plan:
    args: dict[str, object] = {
        "need": 2,
        "site": "a",
        "free": {"a": 2, "b": 4},
        "time_left_s": 60.0,
        "suspend_s": 10.0,
        "migrate_s": 3.0,
        "wait_s": 15.0,
    }
    args.update(kw)
    return plan(**args)  # type: ignore[arg-type]


def test_same_site_first_then_the_others_in_order() -> None:
    assert _plan().targets == (Target("a", Path.SAME_SITE), Target("b", Path.OTHER_SITE))
    assert _plan(free={"c": 9, "a": 2, "b": 4}, time_left_s=600).targets == (
        Target("a", Path.SAME_SITE),
        Target("c", Path.OTHER_SITE),
        Target("b", Path.OTHER_SITE),
    )


def test_only_sites_with_room_and_an_answer() -> None:
    assert _plan(free={"a": 1, "b": 2}).targets == (Target("b", Path.OTHER_SITE),)
    assert _plan(free={"a": None, "b": 2}).targets == (Target("b", Path.OTHER_SITE),)
    none = _plan(free={"a": 1, "b": None})
    assert none.targets == () and "no site has 2 free cores" in none.reason


def test_the_tries_wait_only_as_long_as_the_suspension_still_fits_after_them() -> None:
    # 60 s left; a suspension takes 10 s, a migration 3 s, plus the margin: 42 s, capped by 15 s
    assert _plan().wait_s == 15.0
    assert _plan(time_left_s=30).wait_s == pytest.approx(30 - 10 - 3 - MARGIN_S)
    short = _plan(time_left_s=10 + 3 + MARGIN_S + MIN_WAIT_S - 0.1)
    assert short.targets == () and "no time to try a migration" in short.reason
    assert _plan(time_left_s=10 + 3 + MARGIN_S + MIN_WAIT_S).wait_s == MIN_WAIT_S
    assert _plan(time_left_s=-5).targets == ()  # warned long ago (a manager restarted late)


def test_disabled_migration_suspends_at_once() -> None:
    off = _plan(wait_s=0)
    assert off.targets == () and "migrate_wait_s = 0" in off.reason


def test_bad_need_is_refused() -> None:
    with pytest.raises(ValueError, match="need = 0"):
        _plan(need=0)


def test_migration_estimate_uses_the_measured_speed() -> None:
    assert migrate_estimate_s(512, 2) == pytest.approx(1 + 1024 / 100)
    assert migrate_estimate_s(512, 2, 1024.0) == pytest.approx(2.0)
    assert migrate_estimate_s(512, 2, 0.0) == migrate_estimate_s(512, 2)
    assert suspend_estimate_s(128, 1) == pytest.approx(2 + 256 / 100)


class _Entry:
    def __init__(self, kind: str, **detail: object) -> None:
        self.kind = kind
        self.detail = detail


def test_the_open_migration_request_is_the_last_one_not_closed() -> None:
    """A manager asks for one job at a time: a request is open until migrated, failed or
    abandoned; asked without an id in the journal, it is open with no id (found by name)."""
    asking = _Entry(EventKind.MIGRATION_ASKING, site="b", path="migrate_other_site")
    asked = _Entry(EventKind.MIGRATION_REQUESTED, site="b", path="migrate_other_site", oar_job_id="42")
    assert open_request([]) is None
    assert open_request([asking]) == OpenRequest("b", "migrate_other_site", None)
    assert open_request([asking, asked]) == OpenRequest("b", "migrate_other_site", "42")
    for closing in ("migrated", "migration_failed", "migration_abandoned"):
        assert open_request([asking, asked, _Entry(closing, oar_job_id="42")]) is None
    again = _Entry(EventKind.MIGRATION_REQUESTED, site="a", path="migrate_same_site", oar_job_id="43")
    assert open_request([asked, _Entry("migration_failed"), again]) == OpenRequest("a", "migrate_same_site", "43")
    assert open_request([asking, _Entry("migration_failed", error="oarsub refused")]) is None


def test_the_wait_budget_leaves_room_for_the_suspension() -> None:
    assert wait_budget(time_left_s=60, suspend_s=10, migrate_s=3, wait_s=20) == 20
    assert wait_budget(time_left_s=30, suspend_s=10, migrate_s=3, wait_s=20) == pytest.approx(30 - 13 - MARGIN_S)
    assert wait_budget(time_left_s=20, suspend_s=10, migrate_s=3, wait_s=20) == 0.0  # under MIN_WAIT_S
