"""`[pbs] order = "resource"`: vjob's order in a custom resource users cannot set (issue 36 item 6).

OpenPBS cannot run on this machine: the recorded MetaCentrum `qstat -f -F json` output (PBS Pro
19) plays the server through the stand-in commands (tests/pbs_standins.py), with the job's
`Resource_List.vjob_order` and `Priority` written in as a server would hold them after the
agent's `qalter -l` and a user's `qalter -p`. What PBS itself does with the resource (users
refused by `flag=r`, the scheduler sorting by `job_sort_formula`) is documented in docs/pbs.md
from OpenPBS's documentation, not tried here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.site_read import resync
from plugins.pbs.adapter import PbsAdapter
from plugins.pbs.config import PbsConfig
from tests.pbs_standins import StandIns
from vjob import log
from vjob.errors import InputError

RECORDED = Path("data/fixtures/openpbs/metacentrum_pbspro19_qstat_xf_F_json.json")


def _server(tmp_path: Path, shared_dir: Path, *, order: int | None, priority: int) -> tuple[StandIns, str]:
    """The recorded job queued, holding `order` in vjob_order (None: never written) and `priority`."""
    doc = json.loads((shared_dir / RECORDED).read_text())
    (job_id, job), *_ = doc["Jobs"].items()
    job["job_state"] = "Q"
    job["Priority"] = priority
    if order is not None:
        job["Resource_List"]["vjob_order"] = order
    out = tmp_path / "qstat.json"
    out.write_text(json.dumps(doc))
    standins = StandIns(tmp_path / "bin")
    standins.script("qstat", stdout_file=out)
    return standins, job_id


def test_the_order_goes_to_the_resource_and_a_users_priority_is_ignored(tmp_path: Path, shared_dir: Path) -> None:
    standins, job_id = _server(tmp_path, shared_dir, order=420_000, priority=1023)
    adapter = PbsAdapter(PbsConfig(order="resource", bin_dir=str(standins.dir)))
    knob = adapter.abilities.priority
    assert knob is not None and (knob.low, knob.high) == (0, 1_000_000)
    assert PbsAdapter.abilities.priority.high == 1023  # the class's (Priority) knob is untouched

    assert [j.id for j in adapter.jobs()] == [job_id]
    assert adapter.held == {job_id: 420_000}  # the resource, not the user's Priority 1023
    sent = {job_id: 420_000}
    assert resync(adapter, sent, log.get("test")) == []  # the user's qalter -p changes nothing vjob reads

    adapter.set_priority(job_id, 730_000)
    assert standins.calls()[-1] == ["qalter", "-l", "vjob_order=730000", job_id]
    before = len(standins.calls())
    with pytest.raises(InputError, match=r"0\.\.1000000"):
        adapter.set_priority(job_id, 1_000_001)
    assert len(standins.calls()) == before  # refused before any command


def test_a_value_another_manager_wrote_is_set_back(tmp_path: Path, shared_dir: Path) -> None:
    standins, job_id = _server(tmp_path, shared_dir, order=5, priority=0)
    adapter = PbsAdapter(PbsConfig(order="resource", order_resource="vjob_order", bin_dir=str(standins.dir)))
    adapter.jobs()
    sent = {job_id: 730_000}
    assert resync(adapter, sent, log.get("test")) == [job_id]
    assert sent == {}  # the agent sends its value again this tick
    assert adapter.knob_values() == {job_id: 5}
    assert adapter.neutral_priority() == 0


def test_a_job_never_written_and_the_priority_mode(tmp_path: Path, shared_dir: Path) -> None:
    standins, job_id = _server(tmp_path, shared_dir, order=None, priority=17)
    resource = PbsAdapter(PbsConfig(order="resource", bin_dir=str(standins.dir)))
    resource.jobs()
    assert resource.held == {}  # no vjob_order: nothing held, vjob's value is sent
    plain = PbsAdapter(PbsConfig(bin_dir=str(standins.dir)))
    plain.jobs()
    assert plain.held == {job_id: 17}
    plain.set_priority(job_id, -3)
    assert standins.calls()[-1] == ["qalter", "-p", "-3", job_id]


def test_the_configuration_is_checked() -> None:
    with pytest.raises(ValidationError, match='needs dialect = "openpbs"'):
        PbsConfig(dialect="torque", order="resource")
    with pytest.raises(ValidationError, match="resource name"):
        PbsConfig(order="resource", order_resource="vjob-order;x")
