"""Names the store and the configuration accept are checked with fullmatch: a trailing newline
(a forged second log line or status row) is refused with an InputError/ConfigError naming the
field (issue 23, Low)."""

from __future__ import annotations

import pytest

from vjob import config as vconfig
from vjob.errors import ConfigError, InputError
from vjob.model import Job
from vjob.store import jobs
from vjob.store.db import Store


@pytest.mark.parametrize(
    ("field", "job"),
    [
        ("job.id", Job(id="42\n", user="alice", rms="slurm")),
        ("job.id", Job(id="42\nUserId=root", user="alice", rms="slurm")),
        ("job.user", Job(id="42", user="alice\n", rms="slurm")),
        ("job.account", Job(id="42", user="alice", rms="slurm", account="physics\n")),
        ("job.rms", Job(id="42", user="alice", rms="slurm\n")),
    ],
)
def test_track_refuses_a_trailing_newline(store: Store, field: str, job: Job) -> None:
    with pytest.raises(InputError, match=f"^{field} = "):
        jobs.track(store, job)


def test_real_job_ids_are_accepted(store: Store) -> None:
    for rms, job_id in [
        ("slurm", "123_4"),
        ("slurm", "77+1"),
        ("pbs", "12[3].server.example"),
        ("saline", "be0123abcd"),
    ]:
        jobs.track(store, Job(id=job_id, user="alice@REALM", rms=rms, account="phys-1"))
        assert jobs.get(store, rms, job_id) is not None
    with pytest.raises(InputError, match=r"^job\.id = "):
        jobs.record_preemption(store, "slurm", "123_4\n")
    with pytest.raises(InputError, match=r"^job\.id = "):
        jobs.get(store, "slurm", "x" * 65)


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"saline": {"sites": [{"name": "a\n"}]}}, "saline.sites.0.name"),
        ({"saline": {"sites": [{"name": "../a"}]}}, "saline.sites.0.name"),
        ({"saline": {"mac_prefix": "52:54:00\n"}}, "saline.mac_prefix"),
    ],
)
def test_config_names_refuse_a_trailing_newline(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        vconfig.parse(data)
