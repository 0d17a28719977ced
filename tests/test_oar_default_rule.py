"""Every best-effort job of a site is a vjob on OAR (issue 33, item 6), in a real OAR 2.5.9.

On OAR a vjob is a Saline best-effort job (docs/saline.md), and a site is the resource
property its jobs select (`oar_properties`, here `site='a'`). With `[[saline.sites]]
default_image` the admission rule `vjob oar install-rules` renders makes a plain `oarsub -t
besteffort COMMAND`, with no `-t vjob=IMAGE`, a Saline vjob of that image; `-t vjob=off` leaves
the job a plain best-effort one where `allow_opt_out` is set and is refused, saying so, where
not; a job that is not best-effort is untouched. Real users type real `oarsub`s; the manager
is this process's (tests/test_oar_admission.py's fixture), no VM boots.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from saline_bew import admission, journal, oar_cmd, server
from saline_bew.manager import Manager
from saline_bew.submission import HOLDER, VJOB_COMMAND
from tests.test_oar_admission import job_id, manager, oardel, oarstat, oarsub  # noqa: F401 - the fixture, shared

LIMITS = ("-l", "/resource_id=1,walltime=0:05:00")


def render_from_config(tmp_path: Path, socket: Path, allow_opt_out: bool) -> str:
    """The rule as `vjob oar install-rules --print` renders it from a site's configuration."""
    conf = tmp_path / "vjob.toml"
    conf.write_text(
        f'[saline]\nsocket = "{socket}"\n[[saline.sites]]\nname = "a"\nrepository = "{tmp_path / "repo"}"\n'
        f'oar_properties = "site=\'a\'"\ndefault_image = "empty"\nallow_opt_out = {str(allow_opt_out).lower()}\n'
    )
    parser = argparse.ArgumentParser(prog="vjob")
    parser.add_argument("--config")
    oar_cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["--config", str(conf), "oar", "install-rules", "--print"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert args.func(args) == 0
    return out.getvalue()


@pytest.fixture
def install(oar_cluster, tmp_path: Path) -> Iterator[Callable[[bool], Path]]:
    """Installs the rule with the site default (allow_opt_out as asked); removed at the end."""
    where = Path(tempfile.mkdtemp(prefix="vjob-oar-default-"))
    where.chmod(0o755)
    socket = where / "saline.sock"

    def put(allow_opt_out: bool) -> Path:
        admission.install(render_from_config(tmp_path, socket, allow_opt_out))
        return socket

    try:
        yield put
    finally:
        admission.uninstall()
        shutil.rmtree(where, ignore_errors=True)


def test_render_puts_the_default_and_the_opt_out_in_the_rule(tmp_path: Path) -> None:
    rule = render_from_config(tmp_path, tmp_path / "s.sock", allow_opt_out=False)
    assert '$vjob_image = "empty";' in rule and '"no" ne "yes"' in rule and "@" + "DEFAULT_IMAGE" not in rule
    assert '"" ne ""' in admission.render(site="a", socket="/run/s.sock")  # no default: inert
    with pytest.raises(Exception, match="default image"):
        admission.render(site="a", socket="/run/s.sock", default_image='x"; system("id")')


@pytest.mark.oar
def test_a_plain_besteffort_oarsub_becomes_a_vjob_and_opt_out_is_ruled_by_the_site(
    oar_cluster,
    manager: Manager,  # noqa: F811 - the shared fixture
    install: Callable[[bool], Path],
) -> None:
    user = oar_cluster.user
    socket = install(False)
    submitted: list[str] = []
    try:
        with server.Server(manager, socket):
            proc = oarsub(user, "-t", "besteffort", *LIMITS, "sleep 300")
            oar_id = job_id(proc)
            submitted.append(oar_id)
            key = re.search(r"best-effort vjob (be[0-9a-f]{10})", proc.stdout)
            assert key, proc.stdout
            seen = oarstat(oar_id)
            assert seen["name"] == key.group(1)
            assert seen["command"] == f"/bin/sh {HOLDER} {key.group(1)} {VJOB_COMMAND} {socket} stage"
            assert journal.get(manager.ports.store, key.group(1)).image == "empty"
            deadline = time.monotonic() + 30
            while journal.get(manager.ports.store, key.group(1)).oar_job_id is None and time.monotonic() < deadline:
                manager.step()
                time.sleep(0.5)
            manager.cancel(key.group(1))

            refused = oarsub(user, "-t", "besteffort", "-t", "vjob=off", *LIMITS, "sleep 300")
            said = refused.stdout + refused.stderr
            assert refused.returncode != 0 and "OAR_JOB_ID" not in said, said
            assert "every best-effort job here runs in a VM (image empty)" in said, said
            assert "does not let a job opt out: drop -t vjob=off" in said, said

            plain = oarsub(user, *LIMITS, "sleep 300")  # not best-effort: not a vjob on OAR
            submitted.append(job_id(plain))
            assert "vjob" not in plain.stdout and oarstat(submitted[-1])["command"] == "sleep 300"

        install(True)
        bare = oarsub(user, "-t", "besteffort", "-t", "vjob=off", *LIMITS, "sleep 300")
        submitted.append(job_id(bare))
        seen = oarstat(submitted[-1])
        assert seen["command"] == "sleep 300" and seen["types"] == ["besteffort"], seen
    finally:
        oardel(*submitted)
