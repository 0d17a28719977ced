"""The OAR REST client reads whole collections: OAR's API answers 500 items per page.

Against the stand-in API of tests/saline_env.py, which pages `jobs/details` with
offset/limit exactly as OAR 2.5.9 does (`total`, `offset`, `items`); the real API is in
test_oar_admission.py (501 held jobs).
"""

from __future__ import annotations

from plugins.oar.client import PAGE, OarRest
from saline_bew.repository import Repository
from saline_bew.sites import Site
from tests.saline_env import FakeOar


def _job(i: int, state: str = "Running") -> dict[str, object]:
    return {"id": i, "state": state, "owner": "alice", "name": f"j{i}", "events": [],
            "assigned_resources": [i % 4 + 1]}  # fmt: skip


def test_a_listing_longer_than_one_page_is_complete() -> None:
    with FakeOar() as fake:
        fake.details = [_job(i) for i in range(1, 2 * PAGE + 2)]
        jobs = OarRest(fake.url, timeout_s=5).jobs()
    assert [j.id for j in jobs] == [str(i) for i in range(1, 2 * PAGE + 2)]


def test_free_cores_sees_the_jobs_past_the_first_page(tmp_path) -> None:
    """Before paging, a site with 500 waiting jobs listed first looked entirely free."""
    with FakeOar() as fake:
        fake.details = [_job(i, "Waiting") for i in range(1, PAGE + 1)] + [_job(PAGE + 1 + i) for i in range(4)]
        site = Site("a", OarRest(fake.url, timeout_s=5), Repository("a", str(tmp_path / "repo")))
        assert site.free_cores() == 0
