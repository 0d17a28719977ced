"""The whole configuration file: the kernel's sections and the sections kept beside the code
that reads them, composed into the one TOML file the operator edits.

Why composition: the kernel knows no RMS, no Saline and no tuner (the layers of DESIGN.md:
vjob/ imports nothing above it), yet the operator edits one file, and `vjob config check` must
refuse a typo in `[slurm]` as it does in `[agent]`, naming the key and the value. So `[slurm]`,
`[pbs]`, `[saline]` and `[tune]` are models beside their code (plugins/slurm/config.py, ...),
and SECTION_OWNERS names their modules the way vjob.cli's COMMANDS names a command's: by name,
imported when a section is validated or first read, never when this module is imported (the
owners' packages import vjob.config themselves). Each owned section the file sets is validated
by its owner's model inside Config's own validation, so an error's location stays
`slurm.bin_dir`. A section the file leaves out is its owner's defaults, built on first read
(_Unread): importing plugins.slurm pulls in the adapter and the store (over a second), which
`vjob config check` of a file without `[slurm]` has no reason to pay.

Lookup order for the file: `--config PATH`, then `$VJOB_CONFIG`, then `/etc/vjob/vjob.toml`
when it exists; with none of them the embedded defaults apply (SQLite under the data dir).
"""

from __future__ import annotations

import functools
import importlib
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, PlainSerializer, PlainValidator, SerializationInfo, ValidationError, ValidationInfo

from vjob.config.policy import DeadlineConfig, PlannerConfig, PriorityConfig, RemapConfig, SchedulingConfig
from vjob.config.secret_file import read_secret, with_password
from vjob.config.section import Section
from vjob.config.site import AgentConfig, DatabaseConfig, LoggingConfig, ProvisioningConfig
from vjob.config.toml_file import MAX_CONFIG_BYTES, parse_toml
from vjob.errors import ConfigError
from vjob.secrets import MASK, is_secret_name, mask_text, mask_url

DEFAULT_PATH = Path("/etc/vjob/vjob.toml")
ENV_VAR = "VJOB_CONFIG"

SECTION_OWNERS: dict[str, tuple[str, str]] = {
    "slurm": ("plugins.slurm.config", "SlurmConfig"),
    "pbs": ("plugins.pbs.config", "PbsConfig"),
    "saline": ("saline_bew.config", "SalineConfig"),
    "tune": ("simulator.tune.config", "TuneConfig"),
    "guest": ("provisioning.guest_config", "GuestConfig"),
    "node": ("provisioning.node_service.config", "NodeConfig"),
}
"""Section → (the module beside the code that reads it, its model), imported by name."""


@functools.cache
def owned_section(name: str) -> type[Section]:
    """The model of the owned section `name`, its module imported on first use."""
    module, model = SECTION_OWNERS[name]
    owner: type[Section] = getattr(importlib.import_module(module), model)
    return owner


class _Unread:
    """An owned section the file leaves out, not read yet: its owner's defaults, built (and the
    owner imported) by Config on first read, or when the configuration is dumped or compared."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def resolve(self) -> Section:
        return owned_section(self.name)()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Unread):
            return other.name == self.name
        return bool(self.resolve() == other)

    __hash__ = None  # type: ignore[assignment]  # like the models it stands for

    def __repr__(self) -> str:
        return repr(self.resolve())


def _validate_owned(value: Any, info: ValidationInfo) -> Any:
    """An owned section's value through its owner's model (an instance of it passes as it is,
    as a nested model's would); the owner's errors keep their keys under the section's."""
    if isinstance(value, _Unread):
        return value
    model = owned_section(str(info.field_name))
    return value if isinstance(value, model) else model.model_validate(value)


def _dump_owned(value: Any, info: SerializationInfo) -> Any:
    """An owned section as its model dumps it (its defaults when it was never read)."""
    section = value.resolve() if isinstance(value, _Unread) else value
    return section.model_dump(
        mode=info.mode,
        by_alias=bool(info.by_alias),
        exclude_unset=info.exclude_unset,
        exclude_defaults=info.exclude_defaults,
        exclude_none=info.exclude_none,
    )


OwnedSection = Annotated[Any, PlainValidator(_validate_owned), PlainSerializer(_dump_owned)]
"""A section whose model lives with its owner (Any: the kernel cannot name the class)."""


def _owned(name: str) -> Any:
    """The field of the owned section `name`: its owner's defaults when the file has none."""
    return Field(default_factory=functools.partial(_Unread, name))


def default_data_dir() -> Path:
    """Where vjob keeps its SQLite store and snapshots when nothing is configured."""
    env = os.environ.get("VJOB_DATA_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/vjob")
    return Path.home() / ".local" / "share" / "vjob"


class Config(Section):
    """The whole configuration file."""

    data_dir: str = ""
    """Where vjob keeps its SQLite store, images and snapshots; empty means /var/lib/vjob as
    root, ~/.local/share/vjob otherwise (or $VJOB_DATA_DIR)."""
    database: DatabaseConfig = DatabaseConfig()
    logging: LoggingConfig = LoggingConfig()
    priority: PriorityConfig = PriorityConfig()
    scheduling: SchedulingConfig = SchedulingConfig()
    agent: AgentConfig = AgentConfig()
    provisioning: ProvisioningConfig = ProvisioningConfig()
    planner: PlannerConfig = PlannerConfig()
    slurm: OwnedSection = _owned("slurm")
    pbs: OwnedSection = _owned("pbs")
    saline: OwnedSection = _owned("saline")
    deadline: DeadlineConfig = DeadlineConfig()
    tune: OwnedSection = _owned("tune")
    remap: RemapConfig = RemapConfig()
    guest: OwnedSection = _owned("guest")
    node: OwnedSection = _owned("node")

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if type(value) is _Unread:  # an owned section the file left out, read for the first time
            value = value.resolve()
            self.__dict__[name] = value
        return value

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir) if self.data_dir else default_data_dir()

    @property
    def database_url(self) -> str:
        """The URL the store opens, with the password of [database] password_file filled in
        (read now, checked: vjob.config.secret_file); never print it unmasked."""
        if self.database.password_file:
            return with_password(self.database.url, read_secret(self.database.password_file))
        return self.database.url or f"sqlite:///{self.data_path / 'vjob.sqlite'}"


def parse(data: dict[str, Any], *, source: str = "<config>") -> Config:
    """Validate a configuration mapping; the error names the key, the value and the rule."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None


def _masked(value: Any) -> Any:
    """`value` as an error may echo it: a URL whole through mask_url (its password may hold
    spaces or quotes that would end a URL found in free text), other text through mask_text."""
    if not isinstance(value, str):
        return value
    return mask_text(mask_url(value))


def _describe(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key '{key}'")
            continue
        value = err.get("input")
        # The value is echoed so the operator sees what was read, but a URL's secrets never
        # are (vjob.secrets): a refused database.url is shown masked, its password never.
        shown = "(missing)" if err["type"] == "missing" else repr(_masked(value))
        msg = err["msg"].removeprefix("Value error, ")
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
        with chosen.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{chosen}: cannot read the configuration file: {exc.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{chosen}: the configuration file is larger than {MAX_CONFIG_BYTES} bytes")
    return parse(parse_toml(raw, str(chosen)), source=str(chosen))


NOT_SECRET = frozenset({"password_file"})
"""Keys named like a secret that hold where the secret is, not the secret: shown as they are."""


def masked(config: Config) -> dict[str, Any]:
    """The effective configuration as a dict with secrets masked (vjob.secrets: a key named like
    a secret has its value replaced, every URL loses its password and secret query values)."""
    data = config.model_dump(mode="json")
    # The password file is not read to be shown (a user may not read it): its slot is masked.
    shown = with_password(config.database.url, MASK) if config.database.password_file else config.database_url
    data["database"]["effective_url"] = shown
    return _mask(data)


def _mask(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _mask(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, key) for v in value]
    if isinstance(value, str) and value:
        if is_secret_name(key) and key not in NOT_SECRET:
            return MASK
        return mask_text(value)
    return value
