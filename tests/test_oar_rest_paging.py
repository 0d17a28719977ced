"""The OAR REST client reads whole collections: OAR's API answers 500 items per page.

Against the stand-in API of tests/saline_env.py, which pages `jobs/details` with
offset/limit exactly as OAR 2.5.9 does (`total`, `offset`, `items`), and against the real
API of OAR 2.5.9 with 501 held jobs (marker `oar`).
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from plugins.oar.client import PAGE, OarRest
from plugins.oar.parse import HOLDING_STATES
from saline_bew.repository import Repository
from saline_bew.sites import Site
from tests.saline_env import FakeOar
from tests.services import wait_for


def _job(i: int, state: str = "Running") -> dict[str, object]:
    return {"id": i, "state": state, "owner": "alice", "name": f"j{i}", "events": [], "assigned_resources": [i % 4 + 1]}


def test_a_listing_longer_than_one_page_is_complete() -> None:
    with FakeOar() as fake:
        fake.details = [_job(i) for i in range(1, 2 * PAGE + 2)]
        jobs = OarRest(fake.url, timeout_s=5).jobs()
    assert [j.id for j in jobs] == [str(i) for i in range(1, 2 * PAGE + 2)]


def test_jobs_ending_between_two_pages_do_not_hide_later_ones() -> None:
    """Seen on the real API: 3 jobs ended while the first page was read, every later job moved
    down 3 places, and offset paging missed 3 of 501."""
    with FakeOar() as fake:
        fake.details = [_job(i) for i in range(1, 2 * PAGE + 2)]

        def three_end(offset: int) -> None:
            if offset == 0:
                del fake.details[10:13]

        fake.after_page = three_end
        jobs = OarRest(fake.url, timeout_s=5).jobs()
    # Jobs 11-13 were read on the first page, before they ended; nothing after them is missed.
    assert sorted(int(j.id) for j in jobs) == list(range(1, 2 * PAGE + 2))


def test_free_cores_sees_the_jobs_past_the_first_page(tmp_path) -> None:
    """Before paging, a site with 500 waiting jobs listed first looked entirely free."""
    with FakeOar() as fake:
        fake.details = [_job(i, "Waiting") for i in range(1, PAGE + 1)] + [_job(PAGE + 1 + i) for i in range(4)]
        site = Site("a", OarRest(fake.url, timeout_s=5), Repository("a", str(tmp_path / "repo")))
        assert site.free_cores() == 0


@pytest.mark.oar
def test_a_real_rest_listing_of_more_than_500_jobs_is_complete(oar_cluster, tmp_path) -> None:
    """501 held jobs (one array submission, so one oarsub): GET /jobs/details pages at 500."""
    # The OAR server is shared by the suite: a best-effort job an earlier test killed may still be
    # finishing. Start from a site where nothing holds resources, so the free-core count is exact.
    rest = OarRest(oar_cluster.api_url, timeout_s=120)
    wait_for(lambda: rest.jobs(HOLDING_STATES) == [], 180, "earlier tests' OAR jobs to end", interval=2)
    home = os.path.expanduser(f"~{oar_cluster.user}")
    env = {"PATH": os.environ["PATH"], "PWD": home, "HOME": home, "LANG": "C"}
    argv = ["oarsub", "--hold", "--array", str(PAGE + 1), "-n", "vjobpage", "-l", "/resource_id=1", "true"]
    proc = subprocess.run(
        ["runuser", "-u", oar_cluster.user, "--", *argv], capture_output=True, text=True, timeout=300, cwd=home, env=env
    )
    array = re.search(r"OAR_ARRAY_ID=(\d+)", proc.stdout)
    assert array, proc.stdout + proc.stderr
    try:
        mine = [j for j in rest.jobs() if j.name == "vjobpage"]
        assert len(mine) == PAGE + 1 and len({j.id for j in mine}) == PAGE + 1
        assert {j.state for j in mine} == {"Hold"}
        # Free cores ask OAR for the jobs holding resources only (held jobs hold none).
        site = Site("a", rest, Repository("a", str(tmp_path / "repo")), oar_cluster.properties("a"))
        assert rest.jobs(HOLDING_STATES) == [] and site.free_cores() == oar_cluster.resources_per_site
    finally:
        subprocess.run(["oardel", "--array", array.group(1)], capture_output=True, timeout=300, check=False)
