"""What an operator installs (issue 22, items 2 and 6): `vjob deploy`, the shipped files valid,
the units' keys, the dashboard and alert rules naming only metrics the agent exports, and the
sd_notify datagrams the units rely on."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from agent.metrics import AgentMetrics
from plugins import deploy
from saline_bew.metrics import SalineMetrics
from vjob import config as vconfig
from vjob.errors import InputError, VjobError
from vjob.sdnotify import Notifier

REPO = Path(__file__).resolve().parents[1]


def vjob(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "VJOB_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "vjob.cli", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60
    )


def _unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit as {section: {key: [values]}} (keys may repeat)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = out.setdefault(line.strip("[]"), {})
            continue
        assert section is not None and "=" in line, f"not a unit line: {line!r}"
        key, value = line.split("=", 1)
        section.setdefault(key, []).append(value)
    return out


def test_install_all_into_a_directory_gives_every_file_valid_and_with_its_mode(tmp_path: Path) -> None:
    r = vjob("deploy", "install", "all", "--dest", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == len(deploy.CATALOGUE)
    for entry in deploy.CATALOGUE:
        path = deploy.destination(entry, tmp_path / "out")
        if not path.exists():
            path = tmp_path / "out" / entry.name / Path(entry.target).name
        assert path.is_file(), entry.name
        assert stat.S_IMODE(path.stat().st_mode) == entry.mode, entry.name
        text = path.read_text()
        if entry.kind == "toml":
            vconfig.load(path)  # vjob's own loader: every key known and valid
        elif entry.kind == "json":
            json.loads(text)
        elif entry.kind == "yml":
            assert yaml.safe_load(text)["groups"]
        elif entry.kind == "service":
            unit = _unit(text)
            svc = unit["Service"]
            assert svc["Type"] == ["notify"] and svc["WatchdogSec"] and svc["NotifyAccess"] == ["main"]
            assert "Restart" in svc and "ExecStart" in svc and unit["Install"]["WantedBy"]
            assert svc["NoNewPrivileges"] == ["yes"] and svc["ProtectSystem"] == ["strict"]
            exe = svc["ExecStart"][0].split()[0]
            assert exe == deploy.installed_vjob(), "the unit names the vjob that installed it"
        elif entry.kind == "py":
            compile(text, str(path), "exec")
        elif entry.kind == "lua":
            assert "function slurm_job_submit" in text


def test_systemd_accepts_the_units_and_their_man_page(tmp_path: Path) -> None:
    """`systemd-analyze verify` (Debian's systemd, which CI installs) with nothing filtered:
    the units name the installing vjob, and their Documentation=man:vjob(1) resolves to the
    page `vjob deploy install man-page` writes (here under a MANPATH of the test's own)."""
    assert shutil.which("systemd-analyze"), "systemd-analyze missing: apt-get install systemd"
    man1 = tmp_path / "man" / "man1"
    man1.mkdir(parents=True)
    deploy.install(deploy.find("man-page"), man1)
    env = {**os.environ, "MANPATH": str(tmp_path / "man")}
    for name in ("agent-unit", "saline-unit", "node-unit"):
        path, _ = deploy.install(deploy.find(name), tmp_path)
        r = subprocess.run(
            ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60, env=env
        )
        assert r.returncode == 0 and r.stderr.strip() == "", r.stderr


def test_install_keeps_an_edited_file_refuses_a_symlink_and_forces_on_request(tmp_path: Path) -> None:
    entry = deploy.find("slurm-config")
    path, verdict = deploy.install(entry, tmp_path)
    assert verdict == "installed"
    assert deploy.install(entry, tmp_path) == (path, "unchanged")
    path.write_text("[agent]\nrms = 'pbs'\n")
    with pytest.raises(VjobError, match="other content"):
        deploy.install(entry, tmp_path)
    assert "pbs" in path.read_text(), "an operator's edit survives a plain install"
    assert deploy.install(entry, tmp_path, force=True) == (path, "replaced")
    secret = tmp_path / "shadow"
    secret.write_text("root:x\n")
    path.unlink()
    path.symlink_to(secret)
    with pytest.raises(VjobError, match="symbolic link"):
        deploy.install(entry, tmp_path, force=True)
    assert secret.read_text() == "root:x\n"


@pytest.mark.parametrize("name", ["nope", "agent-unit\n", "../../etc/passwd", "A" * 500, ""])
def test_an_unknown_or_malformed_name_is_an_input_error(name: str) -> None:
    with pytest.raises(InputError, match="unknown"):
        deploy.find(name)


def test_deploy_cli_lists_and_paths() -> None:
    r = vjob("deploy", "list", "--json")
    assert r.returncode == 0
    names = [row["name"] for row in json.loads(r.stdout)]
    assert names == [e.name for e in deploy.CATALOGUE]
    r = vjob("deploy", "path", "alert-rules")
    assert r.returncode == 0 and Path(r.stdout.strip()).is_file()
    r = vjob("deploy", "install", "all")
    assert r.returncode == 2 and "--dest" in r.stderr


def test_the_package_data_glob_ships_every_catalogued_file() -> None:
    """setup.cfg's package_data patterns match each file of vjob/deploy_files (a wheel has them)."""
    import configparser
    from fnmatch import fnmatch

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    patterns = [p.strip() for p in cfg["options.package_data"]["vjob"].split(",")]
    for entry in deploy.CATALOGUE:
        anchor, _, rel = entry.source.partition(":")
        if anchor == "generated":  # written at install from the code (the man page)
            continue
        full = f"deploy_files/{rel}" if anchor == "vjob" else rel
        if anchor == "vjob":
            assert any(fnmatch(full, p) and full.count("/") == p.count("/") for p in patterns), full
        else:
            plugin_patterns = [p.strip() for p in cfg["options.package_data"]["plugins"].split(",")]
            assert any(fnmatch(full, p) for p in plugin_patterns) or full.endswith(".py"), full


def _metric_names(expr: str) -> set[str]:
    return {w for w in re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*", expr) if w.startswith(("vjob_", "process_"))}


def _exprs(dashboard: str, rules: str) -> list[str]:
    board = json.loads(deploy.find(dashboard).packaged().read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    groups = yaml.safe_load(deploy.find(rules).packaged().read_text())["groups"]
    return exprs + [r["expr"] for g in groups for r in g["rules"]]


def test_no_rule_of_one_component_fires_where_it_does_not_run() -> None:
    """A Slurm or PBS site loads the agent's rules only: none of them names a Saline series (and
    none uses absent(), which fires wherever a series is missing)."""
    for expr in _exprs("grafana-dashboard", "alert-rules"):
        assert "vjob_saline" not in expr and "absent(" not in expr, expr
    for expr in _exprs("saline-dashboard", "saline-alert-rules"):
        assert "vjob_agent" not in expr and "absent(" not in expr, expr


@pytest.mark.parametrize(
    ("metrics", "dashboard", "rules"),
    [(AgentMetrics, "grafana-dashboard", "alert-rules"), (SalineMetrics, "saline-dashboard", "saline-alert-rules")],
)
def test_dashboard_and_alert_rules_use_only_metrics_their_component_exports(
    metrics: type, dashboard: str, rules: str
) -> None:
    exported = metrics().names()
    exprs = _exprs(dashboard, rules)
    used = set().union(*(_metric_names(e) for e in exprs))
    assert used, "the files name metrics"
    assert used - exported == set()
    # Each exported family is shown or alerted on somewhere (a new metric gets a panel).
    families = {re.sub(r"_(total|created|bucket|sum|count)$", "", n) for n in exported}
    shown = {re.sub(r"_(total|created|bucket|sum|count)$", "", n) for n in used}
    assert families - shown == set()


def test_the_check_would_catch_a_misspelt_metric() -> None:
    assert _metric_names("rate(vjob_preemption_total[5m])") - AgentMetrics().names() == {"vjob_preemption_total"}


def test_sd_notify_sends_ready_and_watchdog_datagrams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(path))
        server.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        n = Notifier()
        assert n.ready("up") and n.watchdog()
        first = server.recv(4096).decode().splitlines()
        assert "READY=1" in first and f"MAINPID={os.getpid()}" in first and "STATUS=up" in first
        assert server.recv(4096) == b"WATCHDOG=1"
        assert n.status("a\nSTOPPING=1")
        assert server.recv(4096) == b"STATUS=a STOPPING=1", "a newline cannot smuggle a second field"


def test_sd_notify_never_waits_for_a_reader_that_does_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full notify queue drops the ping: before, the 11th unread ping blocked the daemon."""
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        n = Notifier()
        sent: list[bool] = []
        pinger = threading.Thread(target=lambda: sent.extend(n.watchdog() for _ in range(300)), daemon=True)
        pinger.start()
        pinger.join(timeout=60)
        assert not pinger.is_alive(), f"a ping blocked after {len(sent)} sent"
        assert sent[0] is True and sent[-1] is False  # the queue filled; the rest were dropped
        assert server.recv(4096) == b"WATCHDOG=1"


def test_sd_notify_without_systemd_does_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert Notifier().ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    assert Notifier().watchdog() is False  # logged, never fatal
