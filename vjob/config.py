"""Configuration: one TOML file, validated at load, with embedded defaults for a first run.

Why pydantic models with `extra="forbid"`: an operator's typo (`[priorty]`, `weigth = 1`) must
be an error naming the key, not a silently ignored setting. Each capability owns one section
class below; the defaults are what a one-machine development cluster needs.

Lookup order for the file: `--config PATH`, then `$VJOB_CONFIG`, then `/etc/vjob/vjob.toml`
when it exists; with none of them the embedded defaults apply (SQLite under the data dir).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from vjob.errors import ConfigError

DEFAULT_PATH = Path("/etc/vjob/vjob.toml")
ENV_VAR = "VJOB_CONFIG"


def default_data_dir() -> Path:
    """Where vjob keeps its SQLite store and snapshots when nothing is configured."""
    env = os.environ.get("VJOB_DATA_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/vjob")
    return Path.home() / ".local" / "share" / "vjob"


class Section(BaseModel):
    """Base of every section: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class DatabaseConfig(Section):
    url: str = ""
    """Any SQLAlchemy URL; empty means SQLite at <data_dir>/vjob.sqlite."""
    connect_timeout_s: float = Field(5.0, gt=0, le=300)
    busy_timeout_s: float = Field(30.0, gt=0, le=600)


class LoggingConfig(Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "console", "json"] = "auto"


class PriorityWeights(Section):
    """The UBIS weights w1..w7 (paper defaults), named after the term they scale."""

    usage: float = Field(0.07, ge=0)
    queue_time: float = Field(0.13, ge=0)
    os_available: float = Field(0.10, ge=0)
    preempt_count: float = Field(0.10, ge=0)
    preempt_time: float = Field(0.16, ge=0)
    free_nodes: float = Field(0.20, ge=0)
    interactive: float = Field(0.24, ge=0)


class PriorityConfig(Section):
    weights: PriorityWeights = PriorityWeights()
    max_queue_time_s: float = Field(7 * 24 * 3600.0, gt=0)
    """Queue time at which the queue-time term saturates at 1 (like Slurm's PriorityMaxAge)."""
    max_preempt_count: int = Field(5, ge=1)
    max_preempt_time_s: float = Field(24 * 3600.0, gt=0)
    usage_half_life_s: float = Field(7 * 24 * 3600.0, gt=0)
    interactive_cap: float = Field(0.15, ge=0, le=1)
    """Largest share of the nodes interactive jobs may hold before their I term drops to 0."""
    interactive_user_cap: float | None = Field(None, ge=0, le=1)
    targets: dict[str, float] = {}
    """Target share per user (0..1); users not listed share what is left equally."""
    account_targets: dict[str, float] = {}

    @field_validator("targets", "account_targets")
    @classmethod
    def _shares(cls, value: dict[str, float]) -> dict[str, float]:
        for name, share in value.items():
            if not 0 <= share <= 1:
                raise ValueError(f"target of {name!r} = {share}: must be between 0 and 1")
        if sum(value.values()) > 1 + 1e-9:
            raise ValueError(f"targets add up to {sum(value.values()):.3f}: must be at most 1")
        return value


class AgentConfig(Section):
    interval_s: float = Field(10.0, gt=0, le=3600)
    rms: Literal["slurm", "pbs", "oar", "sim"] = "slurm"
    metrics_port: int = Field(0, ge=0, le=65535)
    """Prometheus metrics port; 0 disables the exporter."""
    command_timeout_s: float = Field(30.0, gt=0, le=600)


class ProvisioningConfig(Section):
    image_dir: str = ""
    """Where the OS image catalogue keeps base images; empty means <data_dir>/images."""
    snapshot_dir: str = ""
    """Where VM memory states and overlays go; empty means <data_dir>/snapshots (mode 0700)."""
    nodes: dict[str, str] = {}
    """libvirt URI per node name, e.g. {n1 = "qemu:///system"}."""
    default_uri: str = "qemu:///system"
    copy_method: Literal["local", "rsync", "scp"] = "local"
    operation_timeout_s: float = Field(300.0, gt=0)


class PlannerConfig(Section):
    optimizer: Literal["cpsat", "ffd"] = "cpsat"
    time_limit_s: float = Field(10.0, gt=0, le=3600)


class SlurmConfig(Section):
    bin_dir: str = ""
    """Directory of the Slurm commands; empty means search PATH."""
    site_factor_max: int = Field(1_000_000, ge=1)


class PbsConfig(Section):
    dialect: Literal["torque", "openpbs"] = "openpbs"
    bin_dir: str = ""


class SiteConfig(Section):
    name: str
    oar_api_url: str = ""
    oar_bin_dir: str = ""
    repository: str = ""
    """Directory (or host:path) of the site's snapshot repository."""


class SalineConfig(Section):
    snapshot_period_s: float = Field(600.0, gt=0)
    checkpoint_signal: int = Field(12, ge=1, le=64)
    checkpoint_delay_s: int = Field(60, ge=1)
    mac_prefix: str = "52:54:00"
    network: str = "10.0.0.0/8"
    sites: list[SiteConfig] = []

    @field_validator("mac_prefix")
    @classmethod
    def _mac(cls, value: str) -> str:
        parts = value.split(":")
        if len(parts) != 3 or not all(len(p) == 2 and all(c in "0123456789abcdefABCDEF" for c in p) for p in parts):
            raise ValueError(f"{value!r}: must be three hex octets like 52:54:00")
        return value.lower()


class Config(Section):
    """The whole configuration file."""

    data_dir: str = ""
    database: DatabaseConfig = DatabaseConfig()
    logging: LoggingConfig = LoggingConfig()
    priority: PriorityConfig = PriorityConfig()
    agent: AgentConfig = AgentConfig()
    provisioning: ProvisioningConfig = ProvisioningConfig()
    planner: PlannerConfig = PlannerConfig()
    slurm: SlurmConfig = SlurmConfig()
    pbs: PbsConfig = PbsConfig()
    saline: SalineConfig = SalineConfig()

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir) if self.data_dir else default_data_dir()

    @property
    def database_url(self) -> str:
        return self.database.url or f"sqlite:///{self.data_path / 'vjob.sqlite'}"


def parse(data: dict[str, Any], *, source: str = "<config>") -> Config:
    """Validate a configuration mapping; the error names the key, the value and the rule."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None


def _describe(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key '{key}'")
            continue
        value = err.get("input")
        shown = "(missing)" if err["type"] == "missing" else repr(value)
        msg = err["msg"]
        if err["type"] == "literal_error":
            msg = "must be " + msg.removeprefix("Input should be ")
        lines.append(f"{source}: {key} = {shown}: {msg}")
    return "; ".join(lines)


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """Load the configuration from `path`, `$VJOB_CONFIG`, /etc/vjob/vjob.toml, or defaults."""
    chosen: Path | None
    if path is not None:
        chosen = Path(path)
    elif os.environ.get(ENV_VAR):
        chosen = Path(os.environ[ENV_VAR])
    elif DEFAULT_PATH.exists():
        chosen = DEFAULT_PATH
    else:
        return Config()
    try:
        raw = chosen.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{chosen}: cannot read the configuration file: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{chosen}: not valid TOML: {exc}") from None
    return parse(data, source=str(chosen))


SECRET_WORDS = ("password", "secret", "token", "key")


def masked(config: Config) -> dict[str, Any]:
    """The effective configuration as a dict with secrets (and URL passwords) masked."""
    data = config.model_dump(mode="json")
    data["database"]["effective_url"] = config.database_url
    return _mask(data)


def _mask(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _mask(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, key) for v in value]
    if isinstance(value, str):
        if any(w in key.lower() for w in SECRET_WORDS) and value:
            return "***"
        if "://" in value and "@" in value:
            from sqlalchemy.engine import make_url

            try:
                return make_url(value).render_as_string(hide_password=True)
            except Exception:  # noqa: BLE001 - a non-SQLAlchemy URL: mask the userinfo crudely
                scheme, rest = value.split("://", 1)
                return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return value
