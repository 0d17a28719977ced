"""`vjob uninstall` in a staging root: after it nothing of vjob is left but what it keeps on purpose.

Everything through the real commands, in a temporary root: `vjob deploy install --root` puts the
units, the Slurm hook, the man page, the alert rules and the example configuration at their
usual places under it and records them; the store is created (`vjob db upgrade`); the node
service's socket is a real bound Unix socket; the files the agent writes beside slurm.conf and a
VM's files under data_dir are there. `vjob uninstall --root` then removes them all but the
store and the configuration the operator edited (named as kept), and `--purge --purge-store`
those too: no file is left under the root. Not under systemd (this machine's PID 1 is not), so
no unit is stopped: the command says so.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from plugins.slurm.environment import wake_file
from plugins.slurm.vm_sizes import sizes_file
from preemption.deadline.threshold_file import THRESHOLD_NAME

ROOT = Path(__file__).resolve().parent.parent
INSTALLED = ("agent-unit", "node-unit", "slurm-job-submit", "man-page", "alert-rules", "slurm-config")


def _vjob(conf: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "vjob.cli", "--config", str(conf), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ))


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


def test_uninstall_in_a_staging_root_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    data = root / "var/lib/vjob"
    slurm_etc = root / "etc/slurm"
    slurm_etc.mkdir(parents=True)
    (slurm_etc / "slurm.conf").write_text("ClusterName=stage\n")  # the RMS's: never touched
    conf = tmp_path / "vjob.toml"
    conf.write_text(
        f'data_dir = "{data}"\n[slurm]\nconf = "{slurm_etc / "slurm.conf"}"\n'
        f'[node]\nsocket = "{root / "run/vjob/node.sock"}"\n'
    )
    res = _vjob(conf, "deploy", "install", "--root", str(root), *INSTALLED)
    assert res.returncode == 0, res.stderr
    installed = {
        "etc/systemd/system/vjob-agent.service",
        "etc/systemd/system/vjob-node.service",
        "etc/slurm/job_submit.lua",
        "usr/local/share/man/man1/vjob.1",
        "etc/prometheus/rules/vjob-alerts.yml",
        "etc/vjob/vjob.toml",
    }
    assert installed <= set(_files(root)), _files(root)
    assert "var/lib/vjob/deployed.json" in _files(root)
    (root / "etc/vjob/vjob.toml").write_text('# edited by the operator\n[agent]\nrms = "slurm"\n')

    assert _vjob(conf, "db", "upgrade").returncode == 0
    (data / "snapshots/vjob-slurm-7").mkdir(parents=True)
    (data / "snapshots/vjob-slurm-7/mem.save").write_bytes(b"\0" * 4096)
    (data / "agent.wake").touch()
    for path in (wake_file(slurm_etc / "slurm.conf"), sizes_file(slurm_etc / "slurm.conf")):
        path.write_text("x\n")
    (slurm_etc / THRESHOLD_NAME).write_text("2.5\n")
    (root / "run/vjob").mkdir(parents=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "run/vjob/node.sock"))
    sock.close()  # the file stays, as after a killed service

    res = _vjob(conf, "uninstall", "--rms", "slurm", "--root", str(root))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "not under systemd" in res.stderr
    assert "JobSubmitPlugins=lua" in res.stderr  # the next step in slurm.conf, said, not done
    left = set(_files(root))
    assert left == {
        "etc/slurm/slurm.conf",
        "etc/vjob/vjob.toml",
        "var/lib/vjob/deployed.json",
        "var/lib/vjob/vjob.sqlite",
    }, left
    assert "kept      " in res.stdout and "edited since it was installed" in res.stdout
    assert "state store" in res.stdout

    res = _vjob(conf, "uninstall", "--rms", "slurm", "--root", str(root), "--purge", "--purge-store", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    done = json.loads(res.stdout)  # one document
    assert done["failed"] == [] and done["kept"] == [] and str(root / "etc/vjob/vjob.toml") in done["removed"]
    assert _files(root) == ["etc/slurm/slurm.conf"]
    assert not (root / "etc/vjob").exists()  # the directory deploy made for vjob goes with its last file
