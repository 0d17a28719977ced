"""The operator's install guide (docs/operator.md, section 1) run as written (issue 36, items 1
and 6): a wheel of the checkout in its own environment under /opt/vjob, on a controller and on a
compute node, then `vjob agent --once` from that environment against the development cluster.

Why the commands come from the doc: the fenced blocks marked `<!-- install-guide: ROLE -->` are
extracted and run as they are, so the guide and this test cannot drift apart; a command the
guide adds is run the next time, a block that loses its mark fails here.

Why a mount namespace with overlays: the guide writes to /opt/vjob, /usr/local/bin, /etc (the
units, vjob.toml, job_submit.lua) and /var/lib/vjob as root. Each role runs in a private mount
namespace where /etc, /opt and /usr/local are overlays over this machine's (written to a
directory of the test, so the machine is unchanged and Debian's own files, pip's configuration
and Slurm's commands are still seen), and /var/lib/vjob is empty but for the development
cluster's directory, bound back in for its slurm.conf. PATH is a fresh Debian root's: `python3`
is Debian's, `vjob` is whatever the guide put in /usr/local/bin. The `apt-get install` lines are
simulated (`apt-get install -s`): their packages exist and install together.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from vjob.store.db import Store

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "operator.md"
MARKED = re.compile(r"<!-- install-guide: ([a-z-]+) -->\n```bash\n(.*?)```", re.S)
OVERLAID = ("/etc", "/opt", "/usr/local")
STATE = Path("/var/lib/vjob")
FRESH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ACTIVE = "active: holding the agent lease"
WARNING = "OR-Tools is not installed: context switches are planned with first-fit decreasing"
NO_ORTOOLS = (
    "import sys; sys.modules['ortools'] = None  # as if the [planner] extra were not installed\n"
    "from vjob.cli import main; sys.exit(main(sys.argv[1:]))"
)


def guide_blocks(role: str) -> list[str]:
    """The guide's blocks marked for `role`, in their order; a role with none fails the test."""
    found = [body for mark, body in MARKED.findall(GUIDE.read_text()) if mark == role]
    assert found, f"docs/operator.md has no block marked <!-- install-guide: {role} -->"
    return found


class Root:
    """A private view of this machine for one host of the guide (see the module's docstring)."""

    def __init__(self, where: Path, keep: list[Path]) -> None:
        self.where = where
        self.keep = [k for k in keep if k.is_relative_to(STATE)]
        for d in OVERLAID:
            (self.upper(d)).mkdir(parents=True, exist_ok=True)
            (where / "work" / d.strip("/")).mkdir(parents=True, exist_ok=True)
        (where / "state").mkdir(exist_ok=True)

    def upper(self, path: str) -> Path:
        """Where what the guide writes under `path` (one of OVERLAID) lands."""
        top = next(d for d in OVERLAID if path == d or path.startswith(d + "/"))
        return self.where / "upper" / top.strip("/") / path[len(top) :].lstrip("/")

    def _mounts(self) -> str:
        lines = ["set -euo pipefail"]
        for d in OVERLAID:
            work = self.where / "work" / d.strip("/")
            lines.append(f"mount -t overlay overlay -o lowerdir={d},upperdir={self.upper(d)},workdir={work} {d}")
        for n, kept in enumerate(self.keep):  # bound aside before /var/lib/vjob is covered
            aside = self.where / f"keep{n}"
            aside.mkdir(exist_ok=True)
            lines.append(f"mount --bind {shlex.quote(str(kept))} {aside}")
        lines.append(f"mkdir -p {STATE} && mount --bind {self.where / 'state'} {STATE}")
        for n, kept in enumerate(self.keep):
            lines.append(f"mkdir -p {shlex.quote(str(kept))} && mount --bind {self.where / f'keep{n}'} {kept}")
        return "\n".join(lines) + "\ncd /\n"

    def run(self, script: str, *, timeout: int = 900) -> subprocess.CompletedProcess[str]:
        """`script` in bash (-e, -x) inside this root; as the guide's reader runs it, as root."""
        env = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}  # the machine's own pip set-up
        env |= {"PATH": FRESH_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
        body = self._mounts() + "set -x\n" + script
        return subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--", "bash", "-c", body],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _ok(done: subprocess.CompletedProcess[str], what: str) -> str:
    assert done.returncode == 0, f"{what} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done.stdout


def _checkout_into(dest: Path) -> None:
    """The files of this checkout as a clone would have them (tracked and new, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        src = REPO / os.fsdecode(name)
        if src.is_file():  # a file deleted in the work tree is still in the index
            (dest / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / os.fsdecode(name))


def _simulate_apt(block: str) -> None:
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[:3] == ["apt-get", "install", "-y"], f"an apt block holds {line!r}"
        done = subprocess.run(
            ["apt-get", "install", "-s", *words[3:]], capture_output=True, text=True, timeout=300, check=False
        )
        _ok(done, f"apt-get install -s {' '.join(words[3:])}")


def _edit_config(path: Path, slurm_conf: Path) -> None:
    """What the guide asks the operator to set in the example vjob.toml: the store (empty: SQLite
    under /var/lib/vjob) and slurm.conf (the development cluster's); the exporter off, so that
    the test's agent takes no port."""
    text = path.read_text()
    for key, value in (("url", '""'), ("conf", f'"{slurm_conf}"'), ("metrics_port", "0")):
        text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
        assert n == 1, f"the example vjob.toml no longer has one `{key} = ` line: update this edit"
    path.write_text(text)


@pytest.mark.slow
@pytest.mark.slurm
def test_the_guide_as_written_gives_a_working_agent_and_node(slurm_cluster, tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("run as root with util-linux's unshare: the guide's blocks run in a private mount namespace")
    for block in guide_blocks("apt"):
        _simulate_apt(block)
    controller = Root(tmp_path / "controller", [slurm_cluster.root])
    _checkout_into(controller.upper("/usr/local/src/vjob"))
    for block in guide_blocks("controller"):
        _ok(controller.run(block), "the controller's install block")

    (wheel,) = controller.upper("/opt/vjob/wheels").glob("vjob-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert "devkit" not in tops and {"vjob", "agent", "plugins", "migrations"} <= tops, sorted(tops)
    unit = (controller.upper("/etc/systemd/system") / "vjob-agent.service").read_text()
    assert "ExecStart=/opt/vjob/bin/vjob --config /etc/vjob/vjob.toml agent" in unit
    assert (controller.upper("/usr/local/share/man/man1") / "vjob.1").is_file()
    assert (controller.upper("/etc/slurm") / "job_submit.lua").is_file()

    _edit_config(controller.upper("/etc/vjob") / "vjob.toml", slurm_cluster.conf)
    for block in guide_blocks("controller-configured"):
        _ok(controller.run(block), "the guide's configuration check and dry run")
    tick = controller.run("vjob agent --once")
    _ok(tick, "vjob agent --once from /opt/vjob")
    assert ACTIVE in tick.stderr, tick.stderr  # it held the lease and ticked (a standby's tick does nothing)
    assert WARNING not in tick.stderr  # the [planner] extra is installed: CP-SAT, no fallback
    # Its own store: the first agent's lease would make this one a standby for [agent] lease_s.
    etc = controller.upper("/etc/vjob")
    (etc / "ffd.toml").write_text(f'data_dir = "{STATE}/without-ortools"\n' + (etc / "vjob.toml").read_text())
    python = f"/opt/vjob/bin/python -c {shlex.quote(NO_ORTOOLS)}"
    hidden = controller.run(f"{python} --config /etc/vjob/ffd.toml agent --once")
    _ok(hidden, "vjob agent --once without OR-Tools")
    assert ACTIVE in hidden.stderr, hidden.stderr
    assert sum(WARNING in line for line in hidden.stderr.splitlines()) == 1, hidden.stderr
    store = Store(f"sqlite:///{controller.where / 'state' / 'vjob.sqlite'}")
    try:
        store.check()  # the guide's `vjob db upgrade` made the store at the code's schema
    finally:
        store.close()
    no_devkit = controller.run("/opt/vjob/bin/python -c 'import devkit'")
    assert no_devkit.returncode == 1 and "No module named 'devkit'" in no_devkit.stderr, no_devkit.stderr

    node = Root(tmp_path / "node", [])
    wheels = node.upper("/opt/vjob/wheels")
    wheels.mkdir(parents=True)
    shutil.copy2(wheel, wheels / wheel.name)  # the guide's scp from the controller
    for block in guide_blocks("node"):
        _ok(node.run(block), "the compute node's install block")
    _ok(node.run("/opt/vjob/bin/python -c 'import libvirt' && vjob run --help >/dev/null"), "the node's vm extra")
    node_unit = (node.upper("/etc/systemd/system") / "vjob-node.service").read_text()
    assert "/opt/vjob/bin/vjob" in node_unit


def test_without_or_tools_the_agent_plans_with_ffd_and_says_so_once(tmp_path: Path) -> None:
    """The fallback itself, without a cluster: the agent starts (the PBS commands are missing, so
    its one tick fails: exit 1, not the refusal's 2) after one warning naming the extra."""
    empty = tmp_path / "bin"
    empty.mkdir()
    config = tmp_path / "vjob.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n[agent]\nrms = "pbs"\n[pbs]\nbin_dir = "{empty}"\n')
    done = subprocess.run(
        [sys.executable, "-c", NO_ORTOOLS, "--config", str(config), "agent", "--once"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    warned = [line for line in done.stderr.splitlines() if WARNING in line]
    assert len(warned) == 1 and "vjob[planner]" in warned[0], done.stderr
    assert "the tick did not run whole" in done.stderr
