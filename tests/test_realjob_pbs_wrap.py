"""Transparent submission on Torque (issue 15 item 2): plugins/pbs/wrap_filter.py run as qsub
runs a SUBMITFILTER, and its wrapper run by /bin/sh with a stand-in `vjob` that records what
it is given (PBS cannot run here: the sanctioned stand-in exception, tests/pbs_standins.py)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FILTER = Path(__file__).resolve().parents[1] / "plugins" / "pbs" / "wrap_filter.py"

SCRIPT = b"""#!/bin/bash
#PBS -N tai-3
#PBS -l nodes=1:ppn=4,walltime=1:00:00
#PBS -S /usr/bin/python3
#VJOB os=debian12

cd $PBS_O_WORKDIR
python3 -c 'print("r\xc3\xa9sultat")' > result.txt
exit 3
"""

VJOB_STANDIN = """#!{python}
import json, os, sys
data = sys.stdin.buffer.read()
json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd(), "stdin": data.decode("latin-1")}},
          open(os.environ["RECORD"], "w"))
sys.exit(3)
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "vjob.toml"
    path.write_text('[pbs]\nos_images = ["debian12", "debian-tiny", "rocky9"]\nfilter_budget_s = 5\n')
    return path


def run_filter(script: bytes, *args: str, config: Path) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "VJOB_CONFIG": str(config)}
    return subprocess.run(
        [sys.executable, str(FILTER), *args], input=script, capture_output=True, env=env, timeout=60, check=False
    )


def _payload(wrapper: bytes) -> bytes:
    body = wrapper.split(b"<<'VJOB_SCRIPT_END'\n", 1)[1].rsplit(b"VJOB_SCRIPT_END\n", 1)[0]
    return base64.b64decode(body)


def test_a_script_naming_an_image_is_wrapped_and_kept_byte_for_byte(config: Path) -> None:
    done = run_filter(SCRIPT, config=config)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith(b"#!/bin/sh\n#PBS -S /bin/sh\n#PBS -v VJOB_CLASS=batch,VJOB_OS=debian12\n#PBS -N tai-3\n")
    assert b"#PBS -l nodes=1:ppn=4,walltime=1:00:00\n" in out and b"/usr/bin/python3" not in out
    assert b'exec vjob run --rms pbs --os debian12 --script - --base64 -- "$@"' in out
    assert _payload(out) == SCRIPT
    again = run_filter(out, config=config)  # a wrapper submitted again is not wrapped twice
    assert again.returncode == 0 and _payload(again.stdout) == SCRIPT and again.stdout.count(b"exec vjob") == 1


def test_the_wrapper_runs_vjob_in_the_submission_directory_with_the_script_and_its_arguments(
    config: Path, tmp_path: Path
) -> None:
    hostile = SCRIPT + b"echo `reboot` $(rm -rf ~) 'VJOB_SCRIPT_END'\nVJOB_SCRIPT_END\n\xff\xfe\x00\r\n"
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_bytes(run_filter(hostile, config=config).stdout)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "vjob").write_text(VJOB_STANDIN.format(python=sys.executable))
    (bindir / "vjob").chmod(0o755)
    workdir = tmp_path / "submitted from"
    workdir.mkdir()
    record = tmp_path / "record.json"
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "PBS_O_WORKDIR": str(workdir), "RECORD": str(record)}
    done = subprocess.run(
        ["/bin/sh", str(wrapper), "a b", "c"], env=env, cwd=tmp_path, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 3, done.stderr  # the pilot's status is the job's
    seen = json.loads(record.read_text())
    assert seen["argv"] == ["run", "--rms", "pbs", "--os", "debian12", "--script", "-", "--base64", "--", "a b", "c"]
    assert seen["cwd"] == str(workdir)
    assert base64.b64decode(seen["stdin"].encode("latin-1")) == hostile
    env["PBS_O_WORKDIR"] = str(tmp_path / "gone")
    record.unlink()
    done = subprocess.run(["/bin/sh", str(wrapper)], env=env, cwd=tmp_path, capture_output=True, timeout=60)
    assert done.returncode == 2 and not record.exists()  # never stages $HOME instead


@pytest.mark.parametrize(
    ("script", "args"),
    [
        (b"#!/bin/sh\nhostname\n", ()),  # no image: an ordinary job
        (b"#!/bin/sh\n#VJOB os=debian-tiny\nexec vjob run --rms pbs\n", ()),  # the counter guest runs vjob itself
        (b"#!/bin/sh\n#VJOB os=debian12\nhostname\n", ("-I",)),  # interactive: no script runs
    ],
)
def test_what_is_not_wrapped_is_only_tagged(config: Path, script: bytes, args: tuple[str, ...]) -> None:
    done = run_filter(script, *args, config=config)
    assert done.returncode == 0 and b"exec vjob run --rms pbs --os" not in done.stdout
    assert b"#PBS -v VJOB_CLASS=" in done.stdout


def test_refusals_and_failing_open_are_the_tagging_filters(config: Path, tmp_path: Path) -> None:
    done = run_filter(b"#!/bin/sh\n#VJOB os=windows95\nhostname\n", config=config)
    assert done.returncode == 1 and done.stdout == b""
    assert b"os = 'windows95': unknown OS image; this site offers debian12, debian-tiny, rocky9" in done.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("[pbs\n")
    done = run_filter(SCRIPT, config=broken)
    assert done.returncode == 0 and done.stdout == SCRIPT and b"job passed unchanged" in done.stderr


def test_a_huge_script_is_wrapped_whole(config: Path) -> None:
    body = b"".join(b"echo line %d\n" % i for i in range(600_000))
    done = run_filter(SCRIPT + body, config=config)
    assert done.returncode == 0, done.stderr
    assert _payload(done.stdout) == SCRIPT + body
