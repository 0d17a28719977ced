"""Configuration: validated at load, errors name the key, the value and what is allowed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vjob import config as vconfig
from vjob.errors import ConfigError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "vjob.toml"
    path.write_text(text)
    return path


def test_defaults_need_no_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("VJOB_CONFIG", raising=False)
    monkeypatch.setenv("VJOB_DATA_DIR", str(tmp_path))
    cfg = vconfig.load()
    assert cfg.database_url == f"sqlite:///{tmp_path / 'vjob.sqlite'}"
    w = cfg.priority.weights
    assert (w.usage, w.queue_time, w.os_available, w.preempt_count, w.preempt_time, w.free_nodes, w.interactive) == (
        0.07,
        0.13,
        0.10,
        0.10,
        0.16,
        0.20,
        0.24,
    )


def test_env_var_names_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = _write(tmp_path, '[database]\nurl = "sqlite:////tmp/x.sqlite"\n')
    monkeypatch.setenv("VJOB_CONFIG", str(path))
    assert vconfig.load().database_url == "sqlite:////tmp/x.sqlite"


def test_explicit_path_beats_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VJOB_CONFIG", str(tmp_path / "missing.toml"))
    path = _write(tmp_path, "[agent]\ninterval_s = 3\n")
    assert vconfig.load(path).agent.interval_s == 3


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[priorty]\nx = 1\n", "unknown key 'priorty'"),
        ("[priority.weights]\nweigth = 1\n", "unknown key 'priority.weights.weigth'"),
        ('[agent]\ninterval_s = "soon"\n', "agent.interval_s = 'soon'"),
        ("[priority.weights]\nusage = -0.5\n", "priority.weights.usage = -0.5"),
        ("[priority]\ninteractive_cap = 1.5\n", "priority.interactive_cap = 1.5"),
        ('[agent]\nrms = "lsf"\n', "agent.rms = 'lsf': must be 'slurm', 'pbs', 'oar' or 'sim'"),
        ('[saline]\nmac_prefix = "zz:00"\n', "saline.mac_prefix"),
        ("[priority.targets]\nalice = 0.8\nbob = 0.5\n", "add up to 1.300"),
        # The sections kept beside their code (vjob.config.composed) are refused the same way.
        ("[slurm]\nbin_dirr = 1\n", "unknown key 'slurm.bin_dirr'"),
        ('[pbs]\ndialect = "pbspro"\n', "pbs.dialect = 'pbspro': must be 'torque' or 'openpbs'"),
        ("[tune]\nbounds = {usage = [0.5, 0.1]}\n", "usage = [0.5, 0.1]: bounds inverted"),
        ("[[saline.sites]]\nrepository = 'r'\n", "saline.sites.0.name = (missing)"),
    ],
)
def test_bad_values_are_named(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        vconfig.load(_write(tmp_path, text))
    assert fragment in str(err.value)
    assert str(tmp_path) in str(err.value)


def test_not_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        vconfig.load(_write(tmp_path, "[agent\n"))


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        vconfig.load(tmp_path / "nope.toml")


def test_secrets_are_masked() -> None:
    cfg = vconfig.parse({"database": {"url": "postgresql://vjob:hunter2@db.example/vjob"}})
    shown = vconfig.masked(cfg)
    assert "hunter2" not in str(shown)
    assert shown["database"]["url"].startswith("postgresql://vjob:***@")


def test_configuration_reference_is_up_to_date() -> None:
    page = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    assert page.read_text() == vconfig.reference(), "run: vjob config reference > docs/configuration.md"


def test_every_key_is_documented() -> None:
    undocumented = [
        line.split("|")[1].strip()
        for line in vconfig.reference().splitlines()
        if line.startswith("| `") and line.rstrip().endswith("|  |")
    ]
    assert undocumented == []


def test_each_owned_section_is_its_owners_model() -> None:
    """`[slurm]`, `[pbs]`, `[saline]`, `[tune]`: their models live beside their code, and a
    Config holds an instance of each whether the file sets it or not."""
    owners = {"slurm": "plugins.slurm.config", "pbs": "plugins.pbs.config", "saline": "saline_bew.config"}
    owners["tune"] = "simulator.tune.config"
    parsed = vconfig.parse({"slurm": {"conf": "/etc/slurm/slurm.conf"}})
    for name, module in owners.items():
        assert type(getattr(vconfig.Config(), name)).__module__ == module
        assert type(getattr(parsed, name)).__module__ == module
    assert parsed.slurm.conf == "/etc/slurm/slurm.conf" and vconfig.Config() == vconfig.Config()


def test_loading_imports_no_owner_whose_section_the_file_leaves_out(tmp_path: Path) -> None:
    """Why the owners are imported on first read: plugins.slurm pulls in the adapter and the
    store (over a second), which `vjob config check` of a file without [slurm] need not pay."""
    path = _write(tmp_path, "[agent]\ninterval_s = 5\n[tune]\npolicy = 'vjob'\n")
    code = (
        "import sys; from vjob import config\n"
        f"cfg = config.load({str(path)!r})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('plugins', 'saline_bew', 'simulator')))\n"
        "print(cfg.slurm.site_factor_max, 'plugins.slurm.config' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.splitlines() == ["['simulator', 'simulator.tune', 'simulator.tune.config']", "1000000 True"]
