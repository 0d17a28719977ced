"""The Torque submit filter run as qsub runs it: the job script on stdin, qsub's arguments as
argv, the (tagged) script expected on stdout, a non-zero exit refusing the job."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

FILTER = Path(__file__).resolve().parents[1] / "plugins" / "pbs" / "submit_filter.py"

SCRIPT = b"""#!/bin/bash
#PBS -N tai-3
#PBS -l nodes=2:ppn=20:ivybridge,walltime=168:00:00
#PBS -A lp_livestockgen
#VJOB os=centos7

cd $PBS_O_WORKDIR
mpirun ./solver --input data.in > out.log
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "vjob.toml"
    path.write_text(
        '[pbs]\nos_images = ["centos7", "rocky9"]\nbesteffort_queues = ["scavenger"]\nfilter_budget_s = 5\n'
    )
    return path


def run_filter(
    script: bytes, *args: str, config: Path | None = None, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, **(environ or {}), "VJOB_CONFIG": str(config) if config else "/nonexistent/vjob.toml"}
    return subprocess.run(
        [sys.executable, str(FILTER), *args], input=script, capture_output=True, env=env, timeout=60, check=False
    )


def test_tags_class_and_os_after_the_shebang(config: Path) -> None:
    done = run_filter(SCRIPT, config=config)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split(b"\n")
    assert lines[0] == b"#!/bin/bash" and lines[1] == b"#PBS -v VJOB_CLASS=batch,VJOB_OS=centos7"
    assert b"\n".join(lines[:1] + lines[2:]) == SCRIPT  # nothing else changed


@pytest.mark.parametrize(
    ("script", "args", "tag"),
    [
        (b"#!/bin/sh\nhostname\n", ("-I",), b"VJOB_CLASS=interactive"),
        (b"#!/bin/sh\nhostname\n", ("-q", "interactive"), b"VJOB_CLASS=interactive"),
        (b"#!/bin/sh\nhostname\n", ("-qinteractive@server",), b"VJOB_CLASS=interactive"),
        (b"#!/bin/sh\n#PBS -q scavenger\nhostname\n", (), b"VJOB_CLASS=besteffort"),
        (b"#!/bin/sh\n#VJOB class=batch\nhostname\n", ("-I",), b"VJOB_CLASS=interactive"),
        (b"#!/bin/sh\n#PBS -q interactive\nhostname\n", (), b"VJOB_CLASS=interactive"),
        (b"#!/bin/sh\nhostname\n", ("-v", "VJOB_OS=rocky9"), b"VJOB_CLASS=batch,VJOB_OS=rocky9"),
        (b"", ("-I",), b"VJOB_CLASS=interactive"),  # qsub -I with no script at all
    ],
)
def test_class_from_directives_and_qsub_arguments(
    config: Path, script: bytes, args: tuple[str, ...], tag: bytes
) -> None:
    done = run_filter(script, *args, config=config)
    assert done.returncode == 0, done.stderr
    assert b"#PBS -v " + tag + b"\n" in done.stdout


def test_merges_into_an_existing_variable_directive(config: Path) -> None:
    script = b"#!/bin/sh\n#PBS -v A=1,VJOB_OS=rocky9,B=x\\,y\n#PBS -N n\nhostname\n"
    done = run_filter(script, config=config)
    assert done.stdout == b"#!/bin/sh\n#PBS -v A=1,B=x\\,y,VJOB_CLASS=batch,VJOB_OS=rocky9\n#PBS -N n\nhostname\n"
    again = run_filter(done.stdout, config=config)  # filtering twice changes nothing more
    assert again.stdout == done.stdout


@pytest.mark.parametrize(
    ("script", "message"),
    [
        (
            b"#!/bin/sh\n#VJOB os=windows95\nhostname\n",
            b"os = 'windows95': unknown OS image; this site offers centos7, rocky9",
        ),
        (b"#!/bin/sh\n#VJOB os=$(reboot)\n", b"os = '$(reboot)': an OS image name has only letters"),
        (b"#!/bin/sh\n#VJOB os=centos7;rm\n", b"an OS image name has only letters"),
        (b"#!/bin/sh\n#VJOB os=-rf\n", b"an OS image name has only letters"),
        (b"#!/bin/sh\n#VJOB colour=red\n", b"line 2: 'colour=red': #VJOB takes class=NAME and os=NAME"),
    ],
)
def test_refuses_with_a_clear_message(config: Path, script: bytes, message: bytes) -> None:
    done = run_filter(script, config=config)
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr.startswith(b"qsub: job rejected by vjob: ") and message in done.stderr


@pytest.mark.parametrize(
    ("script", "args", "environ"),
    [
        (b"#!/bin/sh\n#VJOB class=interactive\nhostname\n", (), {}),  # the script's own word
        (b"#!/bin/sh\n#PBS -v VJOB_CLASS=interactive\nhostname\n", (), {}),
        (b"#!/bin/sh\nhostname\n", ("-v", "VJOB_CLASS=interactive"), {}),
        (b"#!/bin/sh\nhostname\n", ("-V",), {"VJOB_CLASS": "interactive"}),  # the environment, exported by -V
        (b"#!/bin/sh\n#PBS -I\nhostname\n", (), {}),  # -I in a batch script opens no session
        (b"#!/bin/sh\n#VJOB class=urgent\nhostname\n", (), {}),  # no longer a refusal: ignored too
    ],
)
def test_a_user_cannot_choose_the_interactive_class(
    config: Path, script: bytes, args: tuple[str, ...], environ: dict[str, str]
) -> None:
    """Issue 23 item 10: `#VJOB class=interactive` or `VJOB_CLASS=interactive` made any batch job
    interactive. The class now comes from `qsub -I` and the operator's queues only; the user's
    word is dropped from the tag (with a notice), whatever the adapter is later shown."""
    done = run_filter(script, *args, config=config, environ=environ)
    assert done.returncode == 0, done.stderr
    assert b"VJOB_CLASS=batch" in done.stdout and b"VJOB_CLASS=interactive" not in done.stdout
    if b"VJOB" in script + " ".join(args).encode() and b"#PBS -I" not in script:
        assert b"ignored, this job is batch: the class comes from qsub -I or the queue" in done.stderr


def test_a_matching_class_word_is_accepted_silently(config: Path) -> None:
    done = run_filter(b"#!/bin/sh\n#VJOB class=interactive os=rocky9\nhostname\n", "-I", config=config)
    assert done.returncode == 0 and done.stderr == b""
    assert b"#PBS -v VJOB_CLASS=interactive,VJOB_OS=rocky9\n" in done.stdout


def test_directives_after_the_first_command_are_ignored(config: Path) -> None:
    done = run_filter(b"#!/bin/sh\nhostname\n#VJOB os=windows95\n", config=config)
    assert done.returncode == 0 and b"VJOB_OS" not in done.stdout


def test_hostile_names_and_bytes_pass_through_untouched(config: Path) -> None:
    body = (
        b"#PBS -N `reboot`;$(rm -rf ~)|&<>'\"\\\r\n"
        b"#PBS -o /tmp/x\xff\xfe\x00y\x0c\x1c\xe2\x80\xa8z\r\n"
        b"#VJOBS os=ignored #PBSx -I\r\n"
        b"#VJOB os=rocky9\r\n"
        b"echo '\xe9t\xe9' $HOME \x1b[31m\r\n"
    )
    done = run_filter(b"#!/bin/sh\r\n" + body, config=config)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"#!/bin/sh\r\n#PBS -v VJOB_CLASS=batch,VJOB_OS=rocky9\r\n" + body


def test_huge_scripts(config: Path) -> None:
    """An 8 MiB script body (8 times what the filter scans) is copied byte for byte; a header
    of 100,000 comment lines is read only as far as HEADER_LINES and the script still passes."""
    body = b"".join(b"echo line %d\n" % i for i in range(600_000))
    assert len(body) > 8_000_000
    done = run_filter(SCRIPT + body, config=config)
    assert done.returncode == 0 and done.stdout.endswith(body)
    assert done.stdout.startswith(b"#!/bin/bash\n#PBS -v VJOB_CLASS=batch,VJOB_OS=centos7\n#PBS -N tai-3\n")
    comments = b"#!/bin/sh\n" + b"# padding comment line\n" * 100_000 + b"#VJOB os=windows95\nhostname\n"
    done = run_filter(comments, config=config)
    assert done.returncode == 0 and done.stdout.endswith(b"#VJOB os=windows95\nhostname\n")
    assert len(done.stdout) == len(comments) + len(b"#PBS -v VJOB_CLASS=batch\n")


def test_fails_open_on_a_broken_configuration(tmp_path: Path) -> None:
    broken = tmp_path / "vjob.toml"
    broken.write_text("[pbs\nos_images = ")
    done = run_filter(SCRIPT, config=broken)
    assert done.returncode == 0 and done.stdout == SCRIPT
    assert b"configuration unreadable" in done.stderr and b"job passed unchanged" in done.stderr


def test_no_configuration_accepts_any_well_formed_image() -> None:
    done = run_filter(b"#!/bin/sh\n#VJOB os=debian12\nhostname\n")
    assert done.returncode == 0 and b"VJOB_OS=debian12" in done.stdout


def test_passes_the_script_unchanged_once_its_time_budget_is_spent(tmp_path: Path) -> None:
    config = tmp_path / "vjob.toml"
    config.write_text('[pbs]\nos_images = ["centos7"]\nfilter_budget_s = 0.3\n')
    env = {**os.environ, "VJOB_CONFIG": str(config)}
    proc = subprocess.Popen(
        [sys.executable, str(FILTER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdin is not None
    proc.stdin.write(SCRIPT[:40])
    proc.stdin.flush()
    time.sleep(1.5)  # well past the budget: the filter gives up tagging and copies
    proc.stdin.write(SCRIPT[40:])
    proc.stdin.close()
    assert proc.stdout is not None
    out = proc.stdout.read()
    assert proc.wait(timeout=30) == 0 and out == SCRIPT


def test_a_configuration_that_blocks_costs_the_budget_then_the_script_passes(tmp_path: Path) -> None:
    """Issue 39 item 13: the configuration was read before the alarm was set, so a FIFO (or a
    hung mount) at $VJOB_CONFIG held qsub forever. The default budget now covers that read.
    run_filter's 60 s timeout bounds the hang this test would otherwise be."""
    fifo = tmp_path / "vjob.toml"
    os.mkfifo(fifo)
    done = run_filter(SCRIPT, config=fifo)
    assert done.returncode == 0 and done.stdout == SCRIPT
    assert b"configuration not read within 2 s; job passed unchanged" in done.stderr
