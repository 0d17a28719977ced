"""The VMs' usage of a PBS job (issue 33 item 5), on the stand-ins OpenPBS is tested on here:
root's writer adds each run to the job's usage file (plugins/pbs/accounting.py), the hook's
execjob_epilogue puts the node's figures into `resources_used.vjob_cpu_s` / `vjob_peak_mem`,
execjob_end removes the file. A live PBS is not available here (docs/pbs.md)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from plugins.pbs.accounting import PbsUsageWriter
from tests.test_pbs_hook import Hook
from vjob.errors import InputError
from vjob.usage_record import Usage


def test_runs_accumulate_in_the_file_and_the_epilogue_reports_them(tmp_path: Path) -> None:
    hook = Hook(tmp_path)
    writer = PbsUsageWriter(tmp_path / "state")
    writer.add("42.server", "cn1", Usage(100.25, 700, 1))
    text = writer.add("42.server", "cn1", Usage(20.5, 900, 1))
    assert text == "vjob-usage@cn1:cpu_s=120.75,peak_mib=900,runs=2"
    path = writer.path("42.server")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    job = {"id": "42.server", "resources_used": {"cput": "00:00:03"}}
    result = hook.run("EXECJOB_EPILOGUE", job)
    assert result["outcome"] == "accept"
    assert result["resources_used"] == {"cput": "00:00:03", "vjob_cpu_s": 120.75, "vjob_peak_mem": "900mb"}
    assert hook.run("EXECJOB_END", job)["outcome"] == "accept"
    assert not path.exists()


def test_a_job_without_usage_and_a_forged_file_change_nothing(tmp_path: Path) -> None:
    hook = Hook(tmp_path)
    assert hook.run("EXECJOB_EPILOGUE", {"id": "43"})["resources_used"] == {}
    state = tmp_path / "state"
    state.mkdir()
    (state / "44.usage").write_text("vjob-usage@cn1:cpu_s=-1,peak_mib=1,runs=1 junk " + "x" * 20000)
    result = hook.run("EXECJOB_EPILOGUE", {"id": "44"})
    assert result["outcome"] == "accept" and result["resources_used"] == {}
    (state / "45.usage").symlink_to("/etc/passwd")  # never followed
    assert hook.run("EXECJOB_EPILOGUE", {"id": "45"})["resources_used"] == {}


def test_the_writer_refuses_a_bad_job_id(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="job id"):
        PbsUsageWriter(tmp_path).add("../etc/x", "cn1", Usage(1.0, 1, 1))
