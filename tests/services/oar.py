"""A real OAR 2.5.9 for the tests: PostgreSQL cluster, Almighty, the node sshd and the REST API.

Why one OAR with two resource sets instead of two OAR servers: OAR's commands are setuid
wrappers that always read /etc/oar/oar.conf, and Almighty, the node sshd and the API have
fixed ports and pid files, so two servers cannot coexist on one machine without chroots.
The two Saline sites are therefore the resource property `site` ('a' on host localhost, 'b'
on host 127.0.0.1, two resources each), and a site's jobs carry `-p "site='X'"`. A job
killed at site a resumes at site b exactly as it would on a second server (docs/saline.md).

`VJOB_TEST_OAR_API` (an OAR you run yourself, prepared as below) skips the bring-up. Otherwise
everything is started here once per run and stopped by pid at the end, and /etc/oar/oar.conf
is restored from the copy taken before it was edited.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.services import free_port, port_open, stop_pid, wait_for
from tests.services.postgres import drop_cluster, start_cluster

CONF = Path("/etc/oar/oar.conf")
ALMIGHTY_PORT = 6666
NODE_SSHD_PORT = 6667
SERVER_PIDFILE = Path("/var/run/oar-server.pid")
SSHD_PIDFILE = Path("/var/run/oar-node_sshd.pid")
TEST_USER = "oaruser1"
SITES = {"a": "localhost", "b": "127.0.0.1"}
"""Site name -> the OAR host of its resources (two resources each)."""
RESOURCES_PER_SITE = 2

APACHE_CONF = """ServerRoot /etc/apache2
ServerName localhost
Listen 127.0.0.1:{port}
PidFile {d}/httpd.pid
ErrorLog {d}/logs/error.log
User oar
Group oar
LoadModule mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
LoadModule authz_host_module /usr/lib/apache2/modules/mod_authz_host.so
LoadModule mime_module /usr/lib/apache2/modules/mod_mime.so
LoadModule alias_module /usr/lib/apache2/modules/mod_alias.so
LoadModule env_module /usr/lib/apache2/modules/mod_env.so
LoadModule fcgid_module /usr/lib/apache2/modules/mod_fcgid.so
TypesConfig /etc/mime.types
FcgidIPCDir {d}/fcgid
FcgidProcessTableFile {d}/fcgid/table
FcgidMaxProcessesPerClass 3
FcgidInitialEnv OARCONFFILE /etc/oar/oar.conf
ScriptAlias /oarapi /usr/lib/cgi-bin/oarapi/oarapi.cgi
<Directory /usr/lib/cgi-bin/oarapi>
  Options +ExecCGI -MultiViews +FollowSymLinks
  SetHandler fcgid-script
  SetEnv OARCONFFILE /etc/oar/oar.conf
  Require local
</Directory>
"""


@dataclass
class OarCluster:
    """What a test needs to talk to the running OAR."""

    api_url: str
    user: str
    sites: dict[str, str] = field(default_factory=lambda: dict(SITES))
    resources_per_site: int = RESOURCES_PER_SITE

    def properties(self, site: str) -> str:
        """The oarsub -p filter selecting the resources of `site`."""
        return f"site='{site}'"


def _run(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed (rc {proc.returncode}): {proc.stderr.strip() or proc.stdout}")
    return proc.stdout


def _set_conf(text: str, values: dict[str, str]) -> str:
    lines = text.splitlines()
    for key, value in values.items():
        line = f'{key}="{value}"'
        for i, old in enumerate(lines):
            if old.lstrip("#").startswith(f"{key}="):
                lines[i] = line
                break
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False, timeout=10)
    return [int(x) for x in out.stdout.split()]


def _stop_tree(pid: int, grace_s: float = 10) -> None:
    """Stop `pid` and its descendants (Almighty forks its modules), children first, by pid."""
    for child in _children(pid):
        _stop_tree(child, grace_s)
    stop_pid(pid, grace_s=grace_s)


JOB_CPUSETS = Path("/sys/fs/cgroup/cpuset/oar")
"""OAR's cgroup-v1 cpusets, one per running job (`<user>_<id>`): OAREXEC and every process of
the job, those oarsh started included, are in its `tasks` (job_resource_manager_cgroups.pl)."""


def _job_processes() -> set[int]:
    """Pids of OAR jobs' processes: the per-job `perl - JOBID OAREXEC` (uid oar) and everything in
    a job's cpuset. They are detached from Almighty (parent 1, or an ssh session of the node's
    sshd: an interactive or oarsh-started shell), so stopping its tree does not reach them; a
    job OAR never ended (an interactive one), or one launched while the server was being
    stopped (a job submitted at a test's very end), outlives the run with its processes."""
    oar_uid = pwd.getpwnam("oar").pw_uid
    found = set()
    for tasks in JOB_CPUSETS.glob("*/tasks"):
        try:
            found.update(int(x) for x in tasks.read_text().split())
        except (OSError, ValueError):
            continue
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            words = (proc / "cmdline").read_bytes().split(b"\0")
            owner = proc.stat().st_uid
        except OSError:
            continue
        if owner == oar_uid and len(words) >= 4 and words[1] == b"-" and words[2].isdigit() and words[3] == b"OAREXEC":
            found.add(int(proc.name))
    return found


def _stop_jobs(before: set[int]) -> None:
    """Stop, by pid, the jobs' processes that appeared during the run, each with its children
    first; again until a look finds none (a launch in flight when Almighty stopped lands late)."""
    for _ in range(5):
        ours = sorted(_job_processes() - before)
        if not ours:
            return
        for pid in ours:
            _stop_tree(pid, grace_s=2)  # OAREXEC ignores SIGTERM: SIGKILL after the grace
        time.sleep(0.5)


def _pid_alive(pidfile: Path) -> bool:
    try:
        os.kill(int(pidfile.read_text().split()[0]), 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


@pytest.fixture(scope="session")
def oar_cluster() -> Iterator[OarCluster]:
    """A running OAR with sites a and b (started here when `VJOB_TEST_OAR_API` is not set)."""
    given = os.environ.get("VJOB_TEST_OAR_API")
    if given:
        yield OarCluster(api_url=given, user=os.environ.get("VJOB_TEST_OAR_USER", TEST_USER))
        return
    if shutil.which("oarsub") is None or not Path("/usr/lib/oar/Almighty").exists():
        raise RuntimeError("OAR is not installed: apt-get install oar-server oar-server-pgsql oar-node oar-user ...")
    if _pid_alive(SERVER_PIDFILE) or port_open(ALMIGHTY_PORT) or port_open(NODE_SSHD_PORT):
        raise RuntimeError(
            "an OAR server not started by the tests is running; set VJOB_TEST_OAR_API to use it, or stop it"
        )
    base = Path(tempfile.mkdtemp(prefix="vjob-oar-"))
    os.chmod(base, 0o755)
    saved_conf = base / "oar.conf.orig"
    shutil.copy2(CONF, saved_conf)
    pg_port = free_port()
    pg_name = f"vjoboar{pg_port}"
    admin_pw, oar_pw, ro_pw = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
    apache_dir = base / "apache"
    api_port = free_port()
    started: dict[str, int] = {}
    before = _job_processes()  # none of ours yet: only these are left alone at the end
    try:
        log = Path("/var/log/oar.log")
        log.touch()
        shutil.chown(log, "oar", "root")
        start_cluster(pg_name, pg_port, base / "pg", admin_pw)
        CONF.write_text(
            _set_conf(
                saved_conf.read_text(),
                {
                    "DB_PORT": str(pg_port),
                    "DB_BASE_PASSWD": oar_pw,
                    "DB_BASE_PASSWD_RO": ro_pw,
                    "SCHEDULER_MIN_TIME_BETWEEN_2_CALLS": "1",
                },
            )
        )
        _run("oar-database", "--create", "--db-admin-user=postgres", f"--db-admin-pass={admin_pw}", "-y")
        for prop in (["host", "-c"], ["cpu"], ["core"], ["site", "-c"]):
            _run("oarproperty", "-a", *prop)
        ncpu = os.cpu_count() or 1
        core = 0
        for site, host in SITES.items():
            for _ in range(RESOURCES_PER_SITE):
                core += 1
                _run(
                    "oarnodesetting",
                    "-a",
                    "-h",
                    host,
                    "-p",
                    f"host={host}",
                    "-p",
                    f"cpu={core}",
                    "-p",
                    f"core={core}",
                    "-p",
                    f"cpuset={(core - 1) % ncpu}",
                    "-p",
                    f"site={site}",
                )
        _run("/etc/init.d/oar-node", "start")
        wait_for(lambda: SSHD_PIDFILE.exists(), 20, "OAR node sshd pid file")
        started["sshd"] = int(SSHD_PIDFILE.read_text().split()[0])
        _run("/etc/init.d/oar-server", "start")
        wait_for(lambda: SERVER_PIDFILE.exists(), 20, "OAR server pid file")
        started["almighty"] = int(SERVER_PIDFILE.read_text().split()[0])
        wait_for(lambda: port_open(ALMIGHTY_PORT), 30, "Almighty on port 6666")
        (apache_dir / "logs").mkdir(parents=True)
        (apache_dir / "fcgid").mkdir()
        shutil.chown(apache_dir / "fcgid", "oar", "oar")
        (apache_dir / "httpd.conf").write_text(APACHE_CONF.format(port=api_port, d=apache_dir))
        _run("apache2", "-f", str(apache_dir / "httpd.conf"), "-k", "start")
        wait_for(lambda: (apache_dir / "httpd.pid").exists() and port_open(api_port), 20, "OAR REST API")
        started["apache"] = int((apache_dir / "httpd.pid").read_text().split()[0])
        try:
            pwd.getpwnam(TEST_USER)
        except KeyError:
            _run("useradd", "-m", "-s", "/bin/bash", TEST_USER)
        yield OarCluster(api_url=f"http://127.0.0.1:{api_port}/oarapi", user=TEST_USER)
    finally:
        # Almighty first: nothing is launched once it is gone (its bipbip starts the OAREXECs).
        if "almighty" in started:  # its appendice and bipbip ignore SIGTERM: 2 s each, then SIGKILL
            _stop_tree(started["almighty"], grace_s=2)
            SERVER_PIDFILE.unlink(missing_ok=True)
        if "apache" in started:
            stop_pid(started["apache"], grace_s=10)
        if "sshd" in started:
            stop_pid(started["sshd"], grace_s=10)  # no new job session; the open ones are the jobs'
            SSHD_PIDFILE.unlink(missing_ok=True)
        _stop_jobs(before)
        drop_cluster(pg_name, base / "pg")
        shutil.copy2(saved_conf, CONF)
        shutil.rmtree(base, ignore_errors=True)
