"""vjob's OAR admission rule, run by real Perl against a real manager socket (no OAR here).

The rule is the packaged Perl, rendered by `saline_bew.admission.render`, evaluated by a
small Perl harness that sets the variables oarsub's `add_micheline_job` gives the rules
($type_list, $command, $ref_resource_list…) and prints them afterwards: what the rule did to
the submission is read back exactly as OAR would use it. The manager is a real one (store,
socket server) on a stand-in OAR API; the real OAR runs it in test_oar_admission.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from saline_bew import admission, client, journal, phases, protocol, server
from saline_bew.events import EventKind
from saline_bew.manager import Manager
from saline_bew.staging import STAGE_WAIT_S, reaches_socket
from saline_bew.submission import ADMISSION_TIMEOUT_S, HOLDER, VJOB_COMMAND
from tests.saline_env import FakeOar, make_image, make_real_image, manager_on
from tests.services import free_port
from vjob.errors import InputError, UsageError
from vjob.store.db import Store

pytestmark = pytest.mark.libvirt

HARNESS = r"""
use JSON::PP;
my $ctx = JSON::PP->new->decode($ENV{VJOB_RULE_CTX});
my $type_list = $ctx->{types};
my $command = $ctx->{command};
my $user = $ctx->{user};
my $jobType = $ctx->{job_type};
my $reservationField = $ctx->{reservation};
my $ref_resource_list = [[[{resources => [{resource => "resource_id", value => 4}], property => undef}], 7200]];
my $jobproperties = "besteffort = 'YES'";
my ($job_name, $checkpoint, $checkpoint_signal) = ("", 0, 0);
my $rules = do { local $/; open(my $f, "<", $ENV{VJOB_RULE_FILE}) or die; <$f> };
eval $rules;
die("RULE DIED: $@") if $@;
print "\n" . JSON::PP->new->canonical->encode({types => $type_list, command => $command, name => $job_name,
    checkpoint => $checkpoint, signal => $checkpoint_signal, properties => $jobproperties,
    resources => $ref_resource_list->[0]->[0]->[0]->{resources}->[0]->{value},
    walltime => $ref_resource_list->[0]->[1]}) . "\n";
"""


def run_rule(tmp_path: Path, sock: Path, *, timeout_s: int = 5, **ctx: Any) -> tuple[dict[str, Any], str]:
    """Evaluate the rendered rule as oarsub would; (the variables afterwards, what it printed)."""
    rule = tmp_path / "rule.pl"
    rule.write_text(admission.render(site="a", socket=str(sock), timeout_s=timeout_s))
    context = {
        "types": ["besteffort"],
        "command": "true",
        "user": "nobody",
        "job_type": "PASSIVE",
        "reservation": "None",
        **ctx,
    }
    env = {**os.environ, "VJOB_RULE_CTX": json.dumps(context), "VJOB_RULE_FILE": str(rule)}
    proc = subprocess.run(["perl", "-e", HARNESS], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    printed, _, last = proc.stdout.rstrip("\n").rpartition("\n")
    return json.loads(last), printed


@pytest.fixture
def fake() -> Iterator[FakeOar]:
    with FakeOar() as oar:
        yield oar


@pytest.fixture
def manager(tmp_path: Path, test_nodes: dict[str, str], fake: FakeOar) -> Iterator[Manager]:
    store = Store(f"sqlite:///{tmp_path / 'vjob.sqlite'}")
    store.upgrade()
    make_image(store, tmp_path)
    with manager_on(store, tmp_path, test_nodes, fake.url) as m:
        yield m
    store.close()


@pytest.fixture
def sock(manager: Manager) -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="vjob-admission-"))
    os.chmod(where, 0o755)
    path = where / "saline.sock"
    with server.Server(manager, path):
        yield path
    where.rmdir()


def test_a_besteffort_vjob_becomes_the_holder_named_after_the_vjob(
    tmp_path: Path, manager: Manager, sock: Path
) -> None:
    after, printed = run_rule(
        tmp_path, sock, types=["besteffort", "vjob=empty", "vjob_vms=2"], command="./simulate --steps '1e9 x'"
    )
    key = after["name"]
    assert key.startswith("be") and f"best-effort vjob {key}" in printed
    assert after["command"] == f"/bin/sh {HOLDER} {key} {VJOB_COMMAND} {sock} stage"  # it sends the directory
    assert after["types"] == ["besteffort"]  # OAR's type check never sees vjob's types
    assert (after["checkpoint"], after["signal"]) == (60, 12)
    assert after["resources"] == 2 and after["walltime"] == 7200
    job = journal.get(manager.ports.store, key)
    assert (job.user, job.image, job.vm_count, job.walltime) == ("nobody", "empty", 2, "2:00:00")
    assert list(job.command) == ["./simulate", "--steps", "1e9 x"]  # shlex words, no shell
    assert job.oar_job_id is None and [e.kind for e in journal.events(manager.ports.store, key)][-1] == "admitted"


def test_site_properties_are_added_to_the_job(tmp_path: Path, manager: Manager, sock: Path) -> None:
    manager.ports.sites["a"].properties = "site='a'"
    after, _ = run_rule(tmp_path, sock, types=["besteffort", "vjob=empty"])
    assert after["properties"] == "(besteffort = 'YES') AND (site='a')"


def test_jobs_without_the_vjob_type_are_left_alone(tmp_path: Path, manager: Manager, sock: Path) -> None:
    after, printed = run_rule(tmp_path, sock, types=["besteffort", "idempotent"], command="./x")
    assert after == {
        "types": ["besteffort", "idempotent"],
        "command": "./x",
        "name": "",
        "checkpoint": 0,
        "signal": 0,
        "properties": "besteffort = 'YES'",
        "resources": 4,
        "walltime": 7200,
    }
    assert printed == "" and journal.all_jobs(manager.ports.store) == []


def _untouched(after: dict[str, Any], command: str) -> None:
    """Accepted as the user wrote it, minus vjob's own types (which OAR would refuse)."""
    assert after["types"] == ["besteffort"] and after["command"] == command and after["name"] == ""
    assert after["checkpoint"] == 0 and after["resources"] == 4


def test_no_manager_fails_open(tmp_path: Path) -> None:
    after, printed = run_rule(
        tmp_path, tmp_path / "nobody-listens.sock", types=["besteffort", "vjob=empty"], command="./x"
    )
    _untouched(after, "./x")
    assert "no Saline manager at" in printed and "accepted as a plain best-effort job" in printed


def test_the_store_down_fails_open(tmp_path: Path, manager: Manager, sock: Path) -> None:
    dead = Store(f"postgresql+psycopg://vjob:x@127.0.0.1:{free_port()}/vjob", connect_timeout_s=2)
    manager.ports.store = dead  # the manager is up, its store is not
    manager.ports.vms.store = dead
    after, printed = run_rule(tmp_path, sock, types=["besteffort", "vjob=empty"], command="./x")  # hang: 60 s
    _untouched(after, "./x")
    assert "Saline refused it" in printed  # the manager's answer, not the rule's timeout


def test_a_silent_manager_fails_open_within_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "silent.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    try:  # run_rule bounds a rule that never gives up (60 s): the message says its own 1 s fired
        after, printed = run_rule(tmp_path, path, timeout_s=1, types=["besteffort", "vjob=empty"], command="./x")
    finally:
        listener.close()
    _untouched(after, "./x")
    assert "no answer within 1 s" in printed


@pytest.mark.parametrize(
    ("types", "command", "why"),
    [
        (["besteffort", "vjob=empty", "vjob_vms=lots"], "./x", "not a number"),
        (["besteffort", "vjob=../../etc"], "./x", "image"),
        (["besteffort", "vjob=no-such-image"], "./x", "no-such-image"),
        (["besteffort", "vjob=empty"], "./x 'unbalanced", "No closing quotation"),
        (["besteffort", "vjob=empty"], "./x \x00", "command"),
    ],
)
def test_hostile_words_fail_open_with_the_reason(
    tmp_path: Path, manager: Manager, sock: Path, types: list[str], command: str, why: str
) -> None:
    after, printed = run_rule(tmp_path, sock, types=types, command=command)
    assert after["types"] == ["besteffort"] and after["name"] == "" and after["command"] == command
    assert why in printed, printed
    assert journal.all_jobs(manager.ports.store) == []


def test_a_non_besteffort_vjob_is_refused_saying_why(tmp_path: Path) -> None:
    """`-t vjob=IMAGE` alone: the user wants the image and a job that survives preemption;
    running it on the bare nodes would give neither, so oarsub refuses it (vjob need not be up)."""
    with pytest.raises(
        AssertionError, match=r"RULE DIED: \[ADMISSION RULE\] vjob: refused: -t vjob=IMAGE needs -t besteffort"
    ):
        run_rule(tmp_path, tmp_path / "nobody-listens.sock", types=["vjob=empty"], command="./x")


def test_interactive_vjobs_are_plain_jobs(tmp_path: Path, manager: Manager, sock: Path) -> None:
    after, printed = run_rule(tmp_path, sock, types=["besteffort", "vjob=empty"], job_type="INTERACTIVE")
    assert after["types"] == ["besteffort"] and "interactive" in printed
    assert journal.all_jobs(manager.ports.store) == []


def test_only_oar_and_root_may_admit(manager: Manager) -> None:
    handler = server.Handler(manager)
    request = protocol.parse_request(
        json.dumps({"op": "admit", "site": "a", "user": "nobody", "image": "empty", "command": "true"}).encode()
    )
    nobody = 65534
    with pytest.raises(server.Refused, match="only OAR's admission rule"):
        handler(request, nobody)
    assert journal.all_jobs(manager.ports.store) == []


def test_render_refuses_values_that_would_break_out_of_perl_quotes() -> None:
    with pytest.raises(InputError, match="socket"):
        admission.render(site="a", socket="/run/x'; system('id'); '")
    with pytest.raises(InputError, match="site"):
        admission.render(site='a"; die;', socket="/run/vjob/saline.sock")
    rule = admission.render(site="a", socket="/run/vjob/saline.sock")
    assert rule.startswith(admission.MARK)
    assert "@SOCKET@" not in rule and "@SITE@" not in rule and "@TIMEOUT@" not in rule


def test_an_admitted_vjob_adopts_its_oar_job_of_that_name_and_user_only(
    tmp_path: Path, manager: Manager, sock: Path, fake: FakeOar
) -> None:
    after, _ = run_rule(tmp_path, sock, types=["besteffort", "vjob=empty"])
    key = after["name"]
    fake.details = [{"id": 7, "state": "Waiting", "owner": "mallory", "name": key, "events": []}]
    manager.step()  # another user's job of that name is never taken
    assert journal.get(manager.ports.store, key).oar_job_id is None
    fake.details += [{"id": 8, "state": "Waiting", "owner": "nobody", "name": key, "events": []}]
    manager.step()
    job = journal.get(manager.ports.store, key)
    assert job.oar_job_id == "8" and job.phase == "submitted"
    assert [e.kind for e in journal.events(manager.ports.store, key)][-1] == "adopted"
    assert fake.submitted == []  # adopted, never submitted a second time


def test_an_admitted_vjob_whose_oar_job_never_comes_is_abandoned(
    tmp_path: Path, manager: Manager, sock: Path, fake: FakeOar
) -> None:
    after, _ = run_rule(tmp_path, sock, types=["besteffort", "vjob=empty"])
    key = after["name"]
    manager.step()
    assert journal.get(manager.ports.store, key).phase == "submitted"
    later = time.time() + ADMISSION_TIMEOUT_S + 1
    manager.ports.clock = lambda: later
    manager.step()
    assert journal.get(manager.ports.store, key).phase == "cancelled"
    assert "admission_abandoned" in [e.kind for e in journal.events(manager.ports.store, key)]
    assert fake.submitted == []


def test_the_decision_adopts_only_until_the_vjob_has_an_oar_job() -> None:
    class Rec:
        phase = "submitted"
        oar_job_id: str | None = None
        updated_at = 0.0
        snapshot_at = None
        last_event_id = 0

    class Timing:
        snapshot_period_s = 600.0
        requeue_after_s = 30.0

    class Entry:
        def __init__(self, kind: str, at: float) -> None:
            self.kind, self.at, self.detail = kind, at, {}

    admitted = phases.admitted_at([Entry("created", 1), Entry("admitted", 2)])
    assert admitted == 2
    assert phases.decide(Rec(), phases.Observed(admitted_at=admitted), now=3, timing=Timing()).kind is phases.Kind.ADOPT
    assert phases.admitted_at([Entry("admitted", 2), Entry("adopted", 3), Entry("killed", 4)]) is None
    assert phases.decide(Rec(), phases.Observed(), now=3, timing=Timing()).kind is phases.Kind.RESUBMIT


def test_install_rules_print_renders_the_configured_site_and_socket(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`vjob oar install-rules --print` (parser from saline_bew.oar_cmd, as `vjob` registers it)."""
    import argparse

    from saline_bew import oar_cmd

    conf = tmp_path / "vjob.toml"
    conf.write_text('[saline]\nsocket = "/run/vjob/s.sock"\n[[saline.sites]]\nname = "nancy"\nrepository = "/srv/r"\n')
    parser = argparse.ArgumentParser(prog="vjob")
    parser.add_argument("--config")
    oar_cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["--config", str(conf), "oar", "install-rules", "--print", "--timeout", "7"])
    assert args.func(args) == 0
    rule = capsys.readouterr().out
    assert rule.startswith(admission.MARK) and "Peer => '/run/vjob/s.sock'" in rule and 'site => "nancy"' in rule
    assert "alarm(7)" in rule
    for action in parser._subparsers._group_actions[0].choices["oar"]._subparsers._group_actions[0].choices.values():
        assert action.description and "example" in (action.epilog or "")
        assert all(a.help for a in action._actions)
    args = parser.parse_args(["--config", str(conf), "oar", "install-rules", "--site", "lyon", "--print"])
    with pytest.raises(UsageError, match=r"not in saline\.sites"):
        args.func(args)


def test_the_socket_and_lease_keys_are_wired(
    tmp_path: Path, test_nodes: dict[str, str], fake: FakeOar, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(protocol.ENV_VAR, raising=False)
    assert protocol.socket_path(None, configured="/run/x/s.sock") == Path("/run/x/s.sock")
    assert protocol.socket_path("/given.sock", configured="/run/x/s.sock") == Path("/given.sock")
    store = Store(f"sqlite:///{tmp_path / 'vjob.sqlite'}")
    store.upgrade()
    with manager_on(store, tmp_path, test_nodes, fake.url) as m:
        assert m.ports.lease_s == 120.0  # 0: the automatic max(120 s, 30 polls)
        m.ports.cfg.lease_s = 300.0
        assert Manager(m.ports.config, store, m.ports.sites, m.ports.vms).ports.lease_s == 300.0
    store.close()


def _admitted_and_running(tmp_path: Path, manager: Manager, sock: Path, fake: FakeOar) -> tuple[str, list[str]]:
    """`oarsub -t besteffort -t vjob=real ./simulate` through the rule; OAR runs the holder's
    job on n1; the manager adopts it and, on a real image, waits for the directory before
    deploying. (the vjob's key, the holder's command as OAR runs it)"""
    make_real_image(manager.ports.store, tmp_path)
    after, _ = run_rule(tmp_path, sock, types=["besteffort", "vjob=real"], command="./simulate --steps 3")
    key = after["name"]
    command = after["command"].split()
    assert command[:3] == ["/bin/sh", str(HOLDER), key] and command[4:] == [str(sock), "stage"]
    running = {"id": 8, "state": "Running", "owner": "nobody", "name": key, "types": ["besteffort"], "events": []}
    fake.details = [running]
    fake.jobs["8"] = running
    fake.jobs["8/resources"] = {"items": [{"id": 1, "network_address": "n1"}]}
    manager.step()  # adopted
    manager.step()  # running: waits for the holder
    assert journal.get(manager.ports.store, key).phase == "submitted"
    assert [e.kind for e in journal.events(manager.ports.store, key)][-1] == EventKind.WAITING_FOR_WORKDIR
    return key, command


def test_the_oarsub_holder_sends_the_submission_directory_to_the_first_vm(
    tmp_path: Path, manager: Manager, sock: Path, fake: FakeOar
) -> None:
    """The holder (the real holder.sh, run as OAR runs it, in the submission directory) builds
    the directory's job disk with the user's rights and passes it over the socket; the
    manager deploys at its next pass with `./simulate` on the first VM's /work. On SIGUSR1
    (the vjob finished) the holder prints the vjob's output into its own stdout, which OAR
    names OAR.<id>.stdout. (As root here: nobody cannot run this checkout's Python.)"""
    key, command = _admitted_and_running(tmp_path, manager, sock, fake)
    submitted_in = tmp_path / "submitted-in"
    submitted_in.mkdir()
    (submitted_in / "simulate").write_text("#!/bin/sh\necho simulated\n")
    oar_stdout, oar_stderr = tmp_path / "OAR.8.stdout", tmp_path / "OAR.8.stderr"
    with oar_stdout.open("wb") as so, oar_stderr.open("wb") as se:
        holder = subprocess.Popen(command, cwd=submitted_in, stdout=so, stderr=se)
    try:
        deadline = time.monotonic() + 60
        while EventKind.WORKDIR_STAGED not in [e.kind for e in journal.events(manager.ports.store, key)]:
            assert holder.poll() is None and time.monotonic() < deadline, oar_stderr.read_text()
            time.sleep(0.2)
        manager.step()
        job = journal.get(manager.ports.store, key)
        assert job.phase == "running" and job.hosts == ("n1",)
        disk = manager.ports.vms.driver.job_disk_path(job.vm_names[0], "n1")
        raw = tmp_path / "vm0.raw"
        subprocess.run(["qemu-img", "convert", "-q", "-U", "-O", "raw", str(disk), str(raw)], check=True, timeout=60)
        debugfs = shutil.which("debugfs") or "/usr/sbin/debugfs"
        shown = subprocess.run([debugfs, "-R", "cat /work/simulate", str(raw)], capture_output=True, timeout=30)
        assert shown.stdout == b"#!/bin/sh\necho simulated\n"

        out, err = manager.ports.vms.output_logs(job.vm_names[0], "n1")
        out.write_bytes(b"simulated 3 steps\n")  # as virtlogd logs the guest's second and third serial ports
        err.write_bytes(b"COMMAND's error 1\n")
        manager.ports.vms.driver.console_log(
            job.vm_names[0], "n1"
        ).touch()  # a real guest's (the test driver writes none)
        manager.ports.vms.driver.stop(job.vm_names[0], "n1")  # COMMAND ended: the first VM powered off
        manager.step()
        assert journal.get(manager.ports.store, key).phase == "done"
        holder.send_signal(signal.SIGUSR1)  # what the manager's release does through OAR
        assert holder.wait(timeout=60) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert oar_stdout.read_bytes() == b"simulated 3 steps\n", oar_stderr.read_text()
    assert "released" in oar_stderr.read_text() and "COMMAND's error 1" in oar_stderr.read_text()


def test_a_holder_that_sends_nothing_delays_the_first_deployment_by_the_bound_only(
    tmp_path: Path, manager: Manager, sock: Path, fake: FakeOar
) -> None:
    """No directory arrives (the node lacks the vjob command, the holder died): the manager
    deploys after STAGE_WAIT_S with the reason journalled, COMMAND in an empty home. A holder
    that cannot build the disk says so, and the manager goes on at once."""
    key, _ = _admitted_and_running(tmp_path, manager, sock, fake)
    manager.step()
    assert journal.get(manager.ports.store, key).phase == "submitted"
    later = time.time() + STAGE_WAIT_S + 1
    manager.ports.clock = lambda: later
    manager.step()
    job = journal.get(manager.ports.store, key)
    assert job.phase == "running"
    skipped = [e for e in journal.events(manager.ports.store, key) if e.kind == EventKind.WORKDIR_NOT_STAGED]
    assert len(skipped) == 1 and f"within {STAGE_WAIT_S:.0f} s" in skipped[0].detail["reason"]
    with pytest.raises(client.RemoteError, match="too late"):
        client.call(sock, {"op": "stage", "key": key, "declined": "x"})

    assert reaches_socket("test:///tmp/nodes/n1.xml") and reaches_socket("qemu:///system")
    assert not reaches_socket("qemu+ssh://node7.site/system")  # the holder there cannot pass a descriptor here

    manager.ports.clock = time.time
    other, _ = _admitted_and_running(tmp_path, manager, sock, fake)
    assert client.call(sock, {"op": "stage", "key": other, "declined": "working directory: too big"})["staged"] is False
    manager.step()
    assert journal.get(manager.ports.store, other).phase == "running"  # no wait for the bound
