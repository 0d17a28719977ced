"""The node service's PBS authority (plugins/pbs/job_grant.py) for Torque and OpenPBS.

Torque and OpenPBS cannot run on this machine, so — the sanctioned exception to "test against
the real thing" — the authority asks stand-in qstat commands (tests/pbs_standins.py) that replay
records recorded on real servers (tests/data/fixtures, sources in tests/data/README.md): the
MetaCentrum PBS Pro 19 `qstat -xf -F json`, the KU Leuven Torque `qstat -f` text and the Stanford
Torque `qstat -x` XML. What a test changes in a record (the owner, to a login of this machine;
the exec hosts, to the names a test service serves; a hostile value) is done on the parsed
JSON or by replacing one attribute line, and said where it is done. The last test runs the real
`vjob node-service --rms pbs` as root against the stand-ins and asks it as ordinary users.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from plugins.pbs.adapter import PbsAdapter
from plugins.pbs.config import PbsConfig
from plugins.pbs.job_grant import PbsJobAuthority
from provisioning.node_service.config import NodeConfig
from provisioning.node_service.grant import Grant
from tests.node_service_peer import Peer
from tests.pbs_standins import StandIns
from tests.services.node_service import _wait_ready
from vjob.errors import InputError

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "data" / "fixtures"
OPENPBS = FIXTURES / "openpbs" / "metacentrum_pbspro19_qstat_xf_F_json.json"
TORQUE_TEXT = FIXTURES / "torque" / "vsc_qstat_full.txt"
TORQUE_XML = FIXTURES / "torque" / "fyrd_qstat_x.xml"
META_JOB = "12860476.meta-pbs.metacentrum.cz"
VSC_JOB = "20033318.icts-p-svcs-1"
"""Torque, R on r3i1n12 and r3i2n8 with 20 slots each, Resource_List.pmem = 1gb, euser vsc30935."""
NOBODY = pwd.getpwnam("nobody")


def _meta(**changes: Any) -> dict[str, Any]:
    """The recorded OpenPBS document, its one job's attributes changed as given (the owner is
    `nobody@META` unless a change says otherwise: the recorded login does not exist here)."""
    doc = json.loads(OPENPBS.read_text())
    job = doc["Jobs"][META_JOB]
    job["Job_Owner"] = "nobody@META"
    job.update(changes)
    return doc


def _openpbs(tmp_path: Path, doc: dict[str, Any] | None = None) -> tuple[PbsJobAuthority, StandIns]:
    standins = StandIns(tmp_path / "bin")
    (tmp_path / "qstat.json").write_text(json.dumps(doc if doc is not None else _meta()))
    standins.script("qstat", stdout_file=tmp_path / "qstat.json")
    return PbsJobAuthority(PbsAdapter(PbsConfig(dialect="openpbs", bin_dir=str(standins.dir)))), standins


def _torque_text(tmp_path: Path, job: str, lines: dict[str, str]) -> tuple[PbsJobAuthority, StandIns]:
    """The recorded `qstat -f` block of `job`, each attribute named in `lines` given that value
    (its recorded line replaced in place; a key not recorded is added after Job_Name)."""
    recorded = re.split(r"\n(?=Job Id: )", TORQUE_TEXT.read_text())
    block = next(b for b in recorded if b.startswith(f"Job Id: {job}\n")).rstrip("\n").split("\n")
    for key, value in lines.items():
        at = next((i for i, line in enumerate(block) if line.startswith(f"    {key} = ")), None)
        if at is None:
            at = next(i for i, line in enumerate(block) if line.startswith("    Job_Name = ")) + 1
        else:  # the attribute's line and its tab-indented continuation lines (qstat wraps values)
            end = at + 1
            while end < len(block) and block[end].startswith("\t"):
                end += 1
            del block[at:end]
        block.insert(at, f"    {key} = {value}")
    text = "\n".join(block) + "\n"
    standins = StandIns(tmp_path / "bin")
    (tmp_path / "qstat.txt").write_text(text)
    standins.script("qstat", stdout_file=tmp_path / "qstat.txt")
    config = PbsConfig(dialect="torque", torque_format="text", bin_dir=str(standins.dir))
    return PbsJobAuthority(PbsAdapter(config)), standins


def test_openpbs_running_job_is_granted_its_exec_vnode_share_on_each_host(tmp_path: Path) -> None:
    authority, standins = _openpbs(tmp_path)
    expected = Grant(
        "pbs", META_JOB, NOBODY.pw_uid, NOBODY.pw_gid, "nobody", "charon24", ("charon24", "charon21"), 2, 4096
    )
    assert authority.grant(META_JOB, "charon24") == expected
    assert authority.grant(META_JOB, "charon21") == Grant(
        "pbs", META_JOB, NOBODY.pw_uid, NOBODY.pw_gid, "nobody", "charon21", ("charon24", "charon21"), 2, 4096
    )
    assert standins.calls()[0] == ["qstat", "-f", "-F", "json", META_JOB]
    assert authority.grant(META_JOB, "charon99") is None  # not one of its exec hosts


def test_openpbs_memory_falls_back_to_resource_list_mem_shared_over_the_cpus(tmp_path: Path) -> None:
    doc = _meta(exec_vnode="(charon24:ncpus=3)+(charon21:ncpus=1)", exec_host="charon24/0*3+charon21/0")
    authority, _ = _openpbs(tmp_path, doc)  # Resource_List.mem = 8gb over 4 CPUs
    assert (authority.grant(META_JOB, "charon24").cpus, authority.grant(META_JOB, "charon24").memory_mib) == (3, 6144)
    assert authority.grant(META_JOB, "charon21").memory_mib == 2048
    del doc["Jobs"][META_JOB]["Resource_List"]["mem"]
    authority, _ = _openpbs(tmp_path, doc)
    assert authority.grant(META_JOB, "charon24").memory_mib == 0  # unknown, as OAR's


@pytest.mark.parametrize("state", ["Q", "H", "E", "S", "W", "F"])
def test_openpbs_a_job_not_in_state_r_has_no_grant_but_is_owned(tmp_path: Path, state: str) -> None:
    authority, standins = _openpbs(tmp_path, _meta(job_state=state))
    assert authority.grant(META_JOB, "charon24") is None
    owned = authority.owned(META_JOB, "charon24")
    assert owned == Grant(
        "pbs", META_JOB, NOBODY.pw_uid, NOBODY.pw_gid, "nobody", "charon24", ("charon24", "charon21"), 0, 0
    )
    assert ["qstat", "-x", "-f", "-F", "json", META_JOB] in standins.calls()  # the server's history too


def test_an_unknown_owner_is_refused_with_its_name(tmp_path: Path) -> None:
    authority, _ = _openpbs(tmp_path, _meta(Job_Owner="jan_brezina@META"))
    with pytest.raises(InputError, match="owner 'jan_brezina' is not a user of this node"):
        authority.grant(META_JOB, "charon24")


def test_a_job_the_server_does_not_list_is_none(tmp_path: Path) -> None:
    authority, standins = _openpbs(tmp_path)
    standins.script("qstat", exit=153, stderr="qstat: Unknown Job Id 99.meta-pbs.metacentrum.cz\n")
    assert authority.grant("99.meta-pbs.metacentrum.cz", "charon24") is None
    assert authority.owned("99.meta-pbs.metacentrum.cz", "charon24") is None
    standins.script("qstat", stdout_file=tmp_path / "qstat.json")  # lists another job only
    assert authority.grant("4294967294", "charon24") is None
    standins.script("qstat", exit=2, stderr="qstat: cannot connect to server meta-pbs (errno=111)\n")
    with pytest.raises(Exception, match="cannot connect"):  # the server down is not "no such job"
        authority.grant(META_JOB, "charon24")


def test_torque_text_slots_and_pmem_give_cpus_and_memory(tmp_path: Path) -> None:
    authority, standins = _torque_text(tmp_path, VSC_JOB, {"euser": "nobody", "Job_Owner": "nobody@r6i0n1"})
    nodes = ("r3i1n12", "r3i2n8")
    assert authority.grant(VSC_JOB, "r3i2n8") == Grant(
        "pbs", VSC_JOB, NOBODY.pw_uid, NOBODY.pw_gid, "nobody", "r3i2n8", nodes, 20, 20 * 1024
    )
    assert authority.grant(VSC_JOB, "r3i0n1") is None
    assert standins.calls()[0] == ["qstat", "-f", VSC_JOB]


def test_torque_ranges_and_the_short_job_id(tmp_path: Path) -> None:
    lines = {"euser": "nobody", "exec_host": "r3i1n12/0-3,8+r3i2n8/0-1", "Resource_List.mem": "7gb"}
    authority, _ = _torque_text(tmp_path, VSC_JOB, lines)
    grant = authority.grant("20033318", "r3i1n12")  # PBS answers with its server's name added
    assert grant is not None and (grant.job, grant.cpus, grant.memory_mib) == ("20033318", 5, 5 * 1024)
    assert authority.grant("20033318", "r3i2n8").memory_mib == 2048  # min(pmem 1gb x 2, 7gb x 2/7)


@pytest.mark.parametrize("state", ["Q", "H", "E", "C"])
def test_torque_a_job_not_running_is_refused(tmp_path: Path, state: str) -> None:
    authority, _ = _torque_text(tmp_path, VSC_JOB, {"euser": "nobody", "job_state": state})
    assert authority.grant(VSC_JOB, "r3i1n12") is None
    assert authority.owned(VSC_JOB, "r3i1n12").uid == NOBODY.pw_uid


def test_torque_xml_running_finished_and_array_jobs(tmp_path: Path) -> None:
    standins = StandIns(tmp_path / "bin")
    text = TORQUE_XML.read_text().replace("<euser>johnfox</euser>", "<euser>nobody</euser>")
    text = text.replace("<euser>dacre</euser>", "<euser>nobody</euser>")
    assert text.count("<euser>nobody</euser>") >= 2, "the recording's euser elements changed"
    (tmp_path / "qstat.xml").write_text(text)
    standins.script("qstat", stdout_file=tmp_path / "qstat.xml")
    authority = PbsJobAuthority(PbsAdapter(PbsConfig(dialect="torque", bin_dir=str(standins.dir))))
    running = "665199.superserver.stanford.edu"
    assert authority.grant(running, "node01") == Grant(
        "pbs", running, NOBODY.pw_uid, NOBODY.pw_gid, "nobody", "node01", ("node01",), 1, 4096
    )
    assert standins.calls()[0] == ["qstat", "-x", running]
    ended, task = "673174.superserver.stanford.edu", "673175[19].fruster.stanford.edu"
    assert authority.grant(ended, "node04") is None
    assert authority.owned(ended, "node04") == Grant(
        "pbs", ended, NOBODY.pw_uid, NOBODY.pw_gid, "nobody", "node04", ("node04",), 0, 0
    )
    assert authority.owned(task, "node11").nodes == ("node11",)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"exec_host": "../etc/0*2+charon21/0*2"}, "exec_host entry '../etc/0\\*2': not host/N"),
        ({"exec_host": "../0*2+charon21/0*2"}, "exec_host host = '..': not a node name"),
        ({"exec_host": "charon24/0*99999999999999999999+charon21/0*2"}, "exec_host entry 'charon24/0\\*9999"),
        ({"exec_host": "charon24/0*2\ncharon21/0*2"}, "exec_host entry 'charon24/0\\*2\\\\ncharon21/0\\*2'"),
        ({"exec_host": "charon24/0*2+charon21/0*2; rm -rf /"}, "exec_host entry 'charon21/0\\*2; rm -rf /'"),
        ({"exec_host": ["charon24/0*2"]}, "exec_host is \\['charon24/0\\*2'\\]: expected text"),
        ({"exec_host": "charon24/0*2+" * 100_000 + "charon21/0"}, "exec_host is str of 1300010 characters"),
        ({"exec_vnode": "(charon24:ncpus=2)"}, "exec_vnode has 1 chunks, exec_host 2 entries"),
        ({"exec_vnode": "(charon24:ncpus=-2)+(charon21:ncpus=2)"}, "exec_vnode ncpus = '-2'"),
        (
            {"exec_vnode": "(charon24:ncpus=2:mem=99999999999999999999kb)+(charon21:ncpus=2)"},
            "exec_vnode mem = .99999999999999999999kb.: not a size",
        ),
        ({"exec_vnode": "(charon24:ncpus=2:mem=9999999999pb)+(charon21:ncpus=2)"}, "larger than an exbibyte"),
        ({"exec_vnode": "(charon24:ncpus=0)+(charon21:ncpus=2)"}, "0 CPUs on host charon24"),
        ({"Job_Owner": "../../root@META"}, "owner = '../../root': not a user name"),
        ({"Job_Owner": 0}, "neither euser nor Job_Owner"),
        ({"job_state": "Running"}, "job_state = 'Running': not a PBS state letter"),
    ],
)
def test_hostile_fields_are_refused_with_the_field_named(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    authority, _ = _openpbs(tmp_path, _meta(**changes))
    with pytest.raises(InputError, match=message):
        authority.grant(META_JOB, "charon24")


def test_a_job_name_is_data_in_json_and_a_forged_line_in_text_is_refused(tmp_path: Path) -> None:
    forged = "x\n    exec_host = charon99/0*64"
    authority, _ = _openpbs(tmp_path, _meta(Job_Name=forged, Variable_List={"A": "\n    euser = root"}))
    grant = authority.grant(META_JOB, "charon24")
    assert grant is not None and (grant.uid, grant.nodes, grant.cpus) == (NOBODY.pw_uid, ("charon24", "charon21"), 2)
    # qstat -f prints a value's newline as it is: the forged line reads as an attribute there
    authority, _ = _torque_text(tmp_path, VSC_JOB, {"euser": "nobody", "Job_Name": "x\n    exec_host = r3i1n12/0-99"})
    with pytest.raises(InputError, match="attribute exec_host given 2 times"):
        authority.grant(VSC_JOB, "r3i1n12")
    # ...and exec_vnode, which Torque never prints, is not read from the text form at all
    lines = {"euser": "nobody", "Job_Name": "x\n    exec_vnode = (r3i1n12:ncpus=64:mem=1tb)+(r3i2n8:ncpus=64)"}
    authority, _ = _torque_text(tmp_path, VSC_JOB, lines)
    assert authority.grant(VSC_JOB, "r3i1n12").cpus == 20


def test_node_rms_accepts_pbs_and_names_the_choices() -> None:
    assert NodeConfig(rms="pbs").rms == "pbs"
    with pytest.raises(ValueError, match="'lsf': slurm, oar or pbs"):
        NodeConfig(rms="lsf")


def test_a_job_id_that_is_not_pbs_syntax_never_reaches_qstat(tmp_path: Path) -> None:
    authority, standins = _openpbs(tmp_path)
    for bad in ("-x", "12 13", "12.server\n", "12;id", ""):
        with pytest.raises(InputError, match="not a PBS job id"):
            authority.grant(bad, "charon24")
    assert standins.calls() == []


def test_the_node_service_answers_the_owner_of_a_pbs_job_and_refuses_another_user() -> None:
    """`vjob node-service --rms pbs` as root (its systemd unit's way) with the stand-in qstat:
    `nobody`, the job's owner, gets hello with its share; `daemon` is refused."""
    work = Path(tempfile.mkdtemp(prefix="vjob-nodepbs-", dir="/var/tmp"))
    work.chmod(0o755)
    proc = None
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        standins = StandIns(work / "bin")
        (work / "qstat.json").write_text(json.dumps(_meta()))
        standins.script("qstat", stdout_file=work / "qstat.json")
        sock = work / "run" / "node.sock"
        config = work / "vjob.toml"
        config.write_text(
            f'data_dir = "{work / "data"}"\n[pbs]\ndialect = "openpbs"\nbin_dir = "{standins.dir}"\n'
            f'[node]\nsocket = "{sock}"\nnames = ["charon24"]\nrms = "slurm"\nsweep_interval_s = 0\n'
        )
        config.chmod(0o644)
        check = subprocess.run(
            [sys.executable, "-m", "vjob.cli", "node-service", "--rms", "pbs", "--once-check"],
            env={**os.environ, "VJOB_CONFIG": str(config)},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert check.returncode == 0, check.stderr
        summary = json.loads(check.stdout)
        assert (summary["rms"], summary["rms_answers"], summary["names"]) == ("pbs", True, ["charon24"])
        assert standins.calls() == [["qstat", "-f", "-F", "json", "4294967294"]]  # a job id PBS never gives
        notify.bind(str(work / "notify"))
        env = {**os.environ, "VJOB_CONFIG": str(config), "NOTIFY_SOCKET": str(work / "notify")}
        with (work / "service.log").open("wb") as out:  # --rms overrides the file's slurm
            proc = subprocess.Popen(
                [sys.executable, "-m", "vjob.cli", "node-service", "--rms", "pbs"],
                env=env,
                cwd=REPO,
                stdout=out,
                stderr=out,
            )
        _wait_ready(notify, proc, work / "service.log")
        hello = json.dumps({"op": "hello", "job": META_JOB, "node": "charon24"})
        with Peer("nobody", sock) as peer:
            assert peer.ask("open") == "opened 0"
            answer = json.loads(peer.ask(f"send 0 {hello}"))
        assert answer == {
            "ok": True,
            "rms": "pbs",
            "job": META_JOB,
            "uid": NOBODY.pw_uid,
            "gid": NOBODY.pw_gid,
            "user": "nobody",
            "node": "charon24",
            "nodes": ["charon24", "charon21"],
            "cpus": 2,
            "memory_mib": 4096,
        }
        daemon = pwd.getpwnam("daemon").pw_uid
        with Peer("daemon", sock) as peer:
            peer.ask("open")
            refused = json.loads(peer.ask(f"send 0 {hello}"))
        assert refused == {"ok": False, "error": f"job '{META_JOB}' is not a job of uid {daemon} on node 'charon24'"}
        assert ["qstat", "-f", "-F", "json", META_JOB] in standins.calls()
    finally:
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        notify.close()
        if (work / "service.log").exists():
            print((work / "service.log").read_text(errors="replace")[-3000:])
        shutil.rmtree(work, ignore_errors=True)
