"""The files an operator installs, shipped in the package: `vjob deploy list | path | install`.

Why in the package and listed here: `pip install vjob` must be all an operator needs on a
controller; the hook, the units and the example configuration come with the code they match,
and this one catalogue says what each file is and where it goes. The RMS files live beside
their adapter (plugins/<rms>/: job_submit.lua, the PBS hook, the Torque filter, as the tests
run them); the rest (systemd units, example configurations, the Grafana dashboard and the
Prometheus rules) in `vjob/deploy_files/`, package data of the kernel so every layer may read
it. This module sits in the plugins layer because it reads both.

Installing is careful because it runs as root into /etc: a destination that is a symbolic
link is refused (root never follows a link it did not make), an existing file with other
content is kept unless --force (an operator's edited vjob.toml must survive a reinstall), and
each file is written to a temporary file in the same directory, then renamed.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from vjob.cli import build_full_parser
from vjob.cli.man_page import render
from vjob.errors import InputError, VjobError

_PLUGINS = Path(__file__).resolve().parent
_NAME = re.compile(r"[a-z][a-z0-9-]{0,40}")
UNIT_VJOB = "/usr/local/bin/vjob"
"""The vjob path the shipped units name; `install` puts the installing vjob's path instead."""


@dataclass(frozen=True)
class DeployFile:
    """One installable file: where it is in the package, where it goes, what it is."""

    name: str
    source: str
    """`vjob:<path>` (vjob/deploy_files/<path>) or `plugins:<path>` (plugins/<path>)."""
    target: str
    """Its usual place on a host (absolute); `--dest DIR` puts it in DIR under the same name."""
    mode: int
    what: str

    def packaged(self) -> Traversable:
        """The file inside the installed package."""
        anchor, _, rel = self.source.partition(":")
        if anchor == "vjob":
            return resources.files("vjob").joinpath("deploy_files", *rel.split("/"))
        return _PLUGINS.joinpath(*rel.split("/"))

    @property
    def kind(self) -> str:
        """The file's format, from its name: service, toml, json, yml, lua, py or text."""
        suffix = Path(self.target).suffix.lstrip(".")
        return suffix if suffix in {"service", "toml", "json", "yml", "lua", "py"} else "text"


CATALOGUE: tuple[DeployFile, ...] = (
    DeployFile(
        "agent-unit",
        "vjob:agent/vjob-agent.service",
        "/etc/systemd/system/vjob-agent.service",
        0o644,
        "systemd unit of the agent (Type=notify, watchdog, sandboxed)",
    ),
    DeployFile(
        "slurm-config",
        "vjob:slurm/vjob.toml",
        "/etc/vjob/vjob.toml",
        0o600,
        "example /etc/vjob/vjob.toml for a Slurm controller",
    ),
    DeployFile(
        "slurm-job-submit",
        "plugins:slurm/job_submit.lua",
        "/etc/slurm/job_submit.lua",
        0o644,
        "Slurm job_submit plugin: tags interactive jobs, checks the OS image, wakes the agent",
    ),
    DeployFile(
        "pbs-config",
        "vjob:pbs/vjob.toml",
        "/etc/vjob/vjob.toml",
        0o600,
        "example /etc/vjob/vjob.toml for a Torque or OpenPBS server",
    ),
    DeployFile(
        "pbs-hook",
        "plugins:pbs/openpbs_hook.py",
        "/etc/vjob/openpbs_hook.py",
        0o644,
        "OpenPBS / PBS Pro hook (qmgr import hook vjob application/x-python default FILE)",
    ),
    DeployFile(
        "pbs-hook-config",
        "vjob:pbs/vjob_hook.json",
        "/etc/vjob/vjob_hook.json",
        0o644,
        "configuration of the OpenPBS hook (qmgr import hook vjob application/x-config default FILE)",
    ),
    DeployFile(
        "torque-filter",
        "plugins:pbs/submit_filter.py",
        "/usr/local/libexec/vjob/pbs_submit_filter",
        0o755,
        "Torque submit filter (qsub pipes every script through it)",
    ),
    DeployFile(
        "torque-cfg",
        "vjob:pbs/torque.cfg",
        "/etc/vjob/torque.cfg.example",
        0o644,
        "the SUBMITFILTER line to append to $TORQUE_HOME/torque.cfg",
    ),
    DeployFile(
        "saline-config",
        "vjob:saline/vjob-saline.toml",
        "/etc/vjob/vjob.toml",
        0o600,
        "example /etc/vjob/vjob.toml for a Saline site master on OAR",
    ),
    DeployFile(
        "saline-unit",
        "vjob:saline/vjob-saline-manager.service",
        "/etc/systemd/system/vjob-saline-manager.service",
        0o644,
        "systemd unit of the Saline best-effort manager (Type=notify, watchdog, sandboxed)",
    ),
    DeployFile(
        "node-unit",
        "vjob:node/vjob-node.service",
        "/etc/systemd/system/vjob-node.service",
        0o644,
        "systemd unit of the node service on each compute node (root-side operations for job pilots)",
    ),
    DeployFile(
        "oar-admission-rule",
        "vjob:oar/vjob_admission_rule.pl",
        "/etc/vjob/oar/vjob_admission_rule.pl",
        0o644,
        "OAR admission rule template (oarsub -t besteffort -t vjob=IMAGE → Saline vjob); "
        "install it with vjob oar install-rules, which fills in the site and socket",
    ),
    DeployFile(
        "oar-deadline-rule",
        "vjob:oar/vjob_deadline_rule.pl",
        "/etc/vjob/oar/vjob_deadline_rule.pl",
        0o644,
        "OAR admission rule template refusing -t deadline= jobs whose x-factor exceeds X; "
        "install it with vjob oar install-deadline-rule, which fills in the threshold file's path",
    ),
    DeployFile(
        "man-page",
        "generated:vjob.1",
        "/usr/local/share/man/man1/vjob.1",
        0o644,
        "vjob(1), written from this vjob's own commands (the units' Documentation=man:vjob(1))",
    ),
    DeployFile(
        "grafana-dashboard",
        "vjob:monitoring/grafana-vjob-agent.json",
        "/var/lib/grafana/dashboards/vjob-agent.json",
        0o644,
        "Grafana dashboard of the agent's metrics (import it, pick the Prometheus data source)",
    ),
    DeployFile(
        "alert-rules",
        "vjob:monitoring/vjob-alerts.yml",
        "/etc/prometheus/rules/vjob-alerts.yml",
        0o644,
        "Prometheus alerting rules of the agent (agent down, no lease holder, store down, slow checkpoints)",
    ),
    DeployFile(
        "saline-dashboard",
        "vjob:monitoring/grafana-vjob-saline.json",
        "/var/lib/grafana/dashboards/vjob-saline.json",
        0o644,
        "Grafana dashboard of the Saline manager's metrics (OAR best-effort sites)",
    ),
    DeployFile(
        "saline-alert-rules",
        "vjob:monitoring/vjob-saline-alerts.yml",
        "/etc/prometheus/rules/vjob-saline-alerts.yml",
        0o644,
        "Prometheus alerting rules of the Saline manager (stalled, snapshots failing, kills not resubmitted)",
    ),
)
"""Every file `vjob deploy` knows, in the order `list` shows them."""

BY_NAME = {f.name: f for f in CATALOGUE}


def find(name: str) -> DeployFile:
    """The catalogue entry `name`; an unknown or malformed name is an InputError listing the known ones."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name not in BY_NAME:
        raise InputError(f"deploy file {name[:60]!r}: unknown; one of {', '.join(BY_NAME)}")
    return BY_NAME[name]


def content(entry: DeployFile, vjob_path: str | None = None) -> bytes:
    """The bytes to install; a unit names the `vjob` at `vjob_path` (default: this one's)."""
    if entry.source.startswith("generated:"):
        return _generated(entry)
    data = entry.packaged().read_bytes()
    if entry.kind == "service":
        exe = vjob_path or installed_vjob()
        data = data.replace(UNIT_VJOB.encode(), exe.encode())
    return data


def _generated(entry: DeployFile) -> bytes:
    """A file made from this installation's code rather than shipped (the man page: from the
    parsers it documents, so it matches the installed commands)."""
    try:
        release = version("vjob")
    except PackageNotFoundError:  # a plain checkout
        release = "(source)"
    return render(build_full_parser(), release).encode()


def installed_vjob() -> str:
    """The `vjob` command of this installation (beside its Python), else the units' default."""
    beside = Path(sys.executable).with_name("vjob")
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else UNIT_VJOB


def destination(entry: DeployFile, dest: Path | None) -> Path:
    return dest / Path(entry.target).name if dest is not None else Path(entry.target)


def install(entry: DeployFile, dest: Path | None = None, *, force: bool = False) -> tuple[Path, str]:
    """Install `entry` (into `dest` when given); returns (path, "installed"|"unchanged"|"replaced")."""
    path = destination(entry, dest)
    data = content(entry)
    if path.is_symlink():
        raise VjobError(f"{path}: is a symbolic link; refusing to write through it (remove it first)")
    verdict = "installed"
    if path.exists():
        if not path.is_file():
            raise VjobError(f"{path}: exists and is not a regular file")
        if path.read_bytes() == data:
            return path, "unchanged"
        if not force:
            raise VjobError(f"{path}: exists with other content (an edited file?); --force replaces it")
        verdict = "replaced"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, entry.mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path, verdict


__all__ = ["BY_NAME", "CATALOGUE", "DeployFile", "content", "destination", "find", "install"]
