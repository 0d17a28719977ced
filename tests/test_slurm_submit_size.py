"""The sizes job_submit.lua wraps (issue 39 item 10, issue 33 item 6), on the real dev cluster.

A script ending in a newline is wrapped as it is, in a quoted here-document (a copy, no
encoding: bench/submit_wrap.py measures it against a plain sbatch), up to what Slurm's
max_script_size (4 MiB by default) holds once the header is added; over it the job is refused
with the sizes, not Slurm's "Pathname ... too long". A script without a final newline is still
base64-encoded in pure Lua inside slurmctld's job lock (about 0.15-0.35 s of the controller per
MiB, every RPC waiting meanwhile), so it is bounded at 1 MiB and refused over it, limit named.
"""

from __future__ import annotations

import base64
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from devkit.devcluster import DevCluster
from tests.test_realjob_slurm import wrapped_cluster  # noqa: F401 - the fixture, shared

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("wrapped_cluster")]
LIMIT = 1 << 20
"""MAX_WRAP_BYTES in plugins/slurm/job_submit.lua."""


@pytest.fixture
def wrapping(slurm_cluster: DevCluster) -> dict[str, str]:
    """The dev cluster's environment; `wrapped_cluster` (test_realjob_slurm.py) installs this
    checkout's job_submit.lua and lists debian12 around each test."""
    return {**os.environ, **slurm_cluster.env}


def _script(size: int, end: str = "\n") -> str:
    head = "#!/bin/sh\n#VJOB os=debian12\n"
    return head + "#" + "x" * (size - len(head) - 1 - len(end)) + end


def _sbatch(env: dict[str, str], script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sbatch", "--parsable", "--hold", "-o", "/dev/null"],
        input=script,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


@pytest.mark.parametrize(("size", "end"), [(LIMIT, "x"), (3 * LIMIT + LIMIT // 2, "\n")])
def test_a_script_of_the_limit_is_wrapped_byte_for_byte_within_max_script_size(
    wrapping: dict[str, str], size: int, end: str
) -> None:
    """1 MiB without a final newline (base64), and 3.5 MiB with one (literal)."""
    script = _script(size, end)
    assert len(script) == size
    res = _sbatch(wrapping, script)
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    try:
        out = Path(tempfile.mkdtemp()) / "w.sh"
        subprocess.run(
            ["scontrol", "write", "batch_script", job, str(out)],
            env=wrapping,
            check=True,
            capture_output=True,
            timeout=60,
        )
        wrapper = out.read_text()
        assert len(wrapper) < 4 << 20  # Slurm's default max_script_size
        delim = wrapper.split("<<'", 1)[1].split("'\n", 1)[0]
        body = wrapper.split(f"<<'{delim}'\n", 1)[1].rsplit(f"{delim}\n", 1)[0]
        if end == "\n":
            assert "--base64" not in wrapper and body == script
        else:
            assert "--base64" in wrapper and base64.b64decode(body) == script.encode()
    finally:
        subprocess.run(["scancel", job], env=wrapping, timeout=30, check=False, capture_output=True)


@pytest.mark.parametrize("size", [LIMIT + 1, 3 * LIMIT + LIMIT // 2])
def test_a_larger_script_is_refused_with_the_limit_named(wrapping: dict[str, str], size: int) -> None:
    """Without a final newline: one byte over, and 3.5 MiB (which, base64, would pass max_script_size)."""
    res = _sbatch(wrapping, _script(size, "x"))
    assert res.returncode != 0, res.stdout
    said = res.stderr
    assert f"the job script is {size} bytes and does not end with a newline" in said, said
    assert f"at most {LIMIT} bytes (1 MiB)" in said, said


def test_a_script_whose_wrapper_passes_max_script_size_is_refused_with_the_sizes(wrapping: dict[str, str]) -> None:
    """4 MiB: Slurm takes it plain, but not with the wrapper's header."""
    res = _sbatch(wrapping, _script(4 * LIMIT))
    assert res.returncode != 0, res.stdout
    assert f"the job script is {4 * LIMIT} bytes; wrapped to run in a VM it would be" in res.stderr, res.stderr
    assert "over Slurm's max_script_size of 4194304 bytes" in res.stderr, res.stderr


def test_an_unwrapped_script_is_not_bounded_by_vjob(wrapping: dict[str, str]) -> None:
    """No `#VJOB os=`: not wrapped, not vjob's to bound (Slurm's own max_script_size applies)."""
    res = _sbatch(wrapping, "#!/bin/sh\n#" + "x" * (LIMIT + 10) + "\n")
    assert res.returncode == 0, res.stderr
    subprocess.run(
        ["scancel", res.stdout.strip().split(";")[0]], env=wrapping, timeout=30, check=False, capture_output=True
    )


def test_a_real_image_job_whose_memory_cannot_hold_a_vm_is_refused_with_the_numbers(
    wrapping: dict[str, str],
) -> None:
    """Issue 33, item 1: --mem minus the VM's overhead below the guest's minimum."""
    res = subprocess.run(
        ["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--mem=300M"],
        input="#!/bin/sh\n#VJOB os=debian12\ntrue\n",
        capture_output=True,
        text=True,
        timeout=120,
        env=wrapping,
        check=False,
    )
    assert res.returncode != 0, res.stdout
    assert "--mem=300M leaves" in res.stderr and "minimum of 256 MiB" in res.stderr, res.stderr
