"""A user's unchanged script in the real `debian12` guest (real QEMU), through `vjob run`.

The script computes a SHA-256 chain (deterministic, a few tens of seconds under TCG) printing
progress, writes its result into the working directory and ends with `exit 3`. The pilot is
stopped by SIGTERM mid-run (what Slurm sends at a requeue: the VM is saved) and started again
(the VM is restored): the result must equal the chain computed here, the output must hold
every progress line once, the pilot must exit 3, and the files must be back in the directory.
"""

from __future__ import annotations

import hashlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioning import image_build
from provisioning.images import Catalogue
from tests.services import wait_for
from vjob.config import ProvisioningConfig
from vjob.store.db import Store

pytestmark = [pytest.mark.realvm, pytest.mark.slow]

STEPS, ROUNDS = 12, 100_000
SCRIPT = f"""#!/bin/bash
echo "start on $(hostname) as $(id -un) in $(pwd)"
cat input.txt
python3 - <<'PY'
import hashlib
h = open("input.txt", "rb").read().strip()
for step in range(1, {STEPS + 1}):
    for _ in range({ROUNDS}):
        h = hashlib.sha256(h).digest()
    print(f"progress {{step}}/{STEPS} {{h.hex()[:12]}}", flush=True)
open("result.txt", "w").write(h.hex() + "\\n")
PY
echo "to stderr" >&2
exit 3
"""


def expected_chain(seed: bytes) -> str:
    h = seed
    for _ in range(STEPS * ROUNDS):
        h = hashlib.sha256(h).digest()
    return h.hex()


@pytest.fixture(scope="module")
def realjob_site(libvirt_system: str) -> Iterator[Path]:
    """A data dir holding the debian12 image (built once per machine, cached by content)."""
    base = Path(tempfile.mkdtemp(prefix="vjob-realjob-", dir="/var/tmp"))
    base.chmod(0o755)  # QEMU (libvirt-qemu) reaches the image below
    store = Store(f"sqlite:///{base / 'vjob.sqlite'}")
    store.upgrade()
    image_build.build(Catalogue(store, ProvisioningConfig(), data_dir=base / "data"), "debian12")
    store.close()
    (base / "vjob.toml").write_text(f'data_dir = "{base / "data"}"\n')
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _pilot(site: Path, work: Path, job: str, out: Path, err: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "vjob.cli",
        "--config",
        str(site / "vjob.toml"),
        "run",
        "--job-id",
        job,
        "--node",
        "n1",
        "--os",
        "debian12",
        "--script",
        "job.sh",
        "--",
        "arg",
    ]
    return subprocess.Popen(cmd, cwd=work, stdout=out.open("wb"), stderr=err.open("wb"), stdin=subprocess.DEVNULL)


def test_an_unchanged_script_survives_a_checkpoint_and_exits_with_its_status(realjob_site: Path) -> None:
    work = realjob_site / "work"
    work.mkdir()
    (work / "job.sh").write_text(SCRIPT)
    (work / "input.txt").write_text("vjob-seed\n")
    out1, err1 = realjob_site / "out1", realjob_site / "err1"
    t0 = time.monotonic()
    first = _pilot(realjob_site, work, "rj1", out1, err1)
    wait_for(lambda: b"progress 3/" in out1.read_bytes() or first.poll() is not None, 300, "progress 3 in the guest")
    assert first.poll() is None, err1.read_text()[-2000:]
    first.send_signal(signal.SIGTERM)
    assert first.wait(60) == 0
    assert "checkpointed VM vjob-slurm-rj1" in err1.read_text()
    assert not (work / "result.txt").exists()
    out2, err2 = realjob_site / "out2", realjob_site / "err2"
    second = _pilot(realjob_site, work, "rj1", out2, err2)
    assert second.wait(600) == 3, err2.read_text()[-2000:]
    took = time.monotonic() - t0
    assert "restoring VM vjob-slurm-rj1 locally" in err2.read_text()
    assert (work / "result.txt").read_text() == expected_chain(b"vjob-seed") + "\n"
    lines = out2.read_text().splitlines()  # a fresh output file: the pilot replays it whole
    assert lines[0] == f"start on n1 as root in {work}" and lines[1] == "vjob-seed"
    assert [line.split()[1] for line in lines if line.startswith("progress")] == [
        f"{i}/{STEPS}" for i in range(1, STEPS + 1)
    ]
    assert "to stderr" in err2.read_text()
    print(f"checkpointed run: {took:.1f} s")
