"""`vjob config check FILE | show`: validate a configuration, print the effective one."""

from __future__ import annotations

import argparse
import json
from typing import Any

from vjob.cli import load_config

# The configuration models (pydantic) are imported by the commands when they run, so that
# `vjob config --help` does not load them (issue 36).

EPILOG = """\
examples:
  vjob config check /etc/vjob/vjob.toml       before restarting the agent
  vjob config show                            defaults + file + environment, secrets masked
  vjob --config site.toml config show --format json
  vjob config reference > docs/configuration.md

The file is --config, else $VJOB_CONFIG, else /etc/vjob/vjob.toml, else the built-in defaults.
Example files: `vjob deploy list` (slurm-config, pbs-config, saline-config)."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "config",
        help="check a configuration file, show the effective configuration",
        description="Validate and inspect vjob's one TOML configuration file.",
        epilog=EPILOG,
    )
    csub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    chk = csub.add_parser(
        "check",
        help="validate FILE; exit 2 naming the bad key and value",
        description="Load FILE as vjob would; print ok, or exit 2 naming the bad key, its value and what is allowed.",
        epilog=EPILOG,
    )
    chk.add_argument("file", help="the TOML file to check")
    chk.set_defaults(func=_check)
    show = csub.add_parser(
        "show",
        help="print the effective configuration (secrets masked)",
        description="Print every key with its effective value (file over defaults), passwords masked.",
        epilog=EPILOG,
    )
    show.add_argument("--format", choices=("json", "toml"), default="toml", help="output format (default toml)")
    show.set_defaults(func=_show)
    ref = csub.add_parser(
        "reference",
        help="print the Markdown reference of every key (docs/configuration.md)",
        description="Print the Markdown table of every section and key: type, default, bounds, meaning.",
        epilog=EPILOG,
    )
    ref.set_defaults(func=_reference)


def _check(args: argparse.Namespace) -> int:
    from vjob import config as vconfig  # heavy: pydantic

    vconfig.load(args.file)
    print(f"{args.file}: ok")
    return 0


def _reference(args: argparse.Namespace) -> int:
    from vjob import config as vconfig  # heavy: pydantic

    print(vconfig.reference(), end="")
    return 0


def _show(args: argparse.Namespace) -> int:
    from vjob import config as vconfig  # heavy: pydantic

    data = vconfig.masked(load_config(args))
    if args.format == "json":
        print(json.dumps(data, indent=2, sort_keys=True))
    else:  # the derived URL as a comment: the printed file loads back as it is
        effective = data.get("database", {}).pop("effective_url", None)
        print((f"# database in effect: {effective}\n" if effective else "") + _to_toml(data), end="")
    return 0


def _to_toml(data: dict[str, Any]) -> str:
    """The effective configuration as TOML that loads back to the same values: written by
    tomli-w, which quotes any key or string (a user name "alice.smith" or "bob@lab" stays one
    key). TOML has no null: keys left unset are named in a comment line instead."""
    unset: list[str] = []

    def present(d: dict[str, Any], prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in d.items():
            name = f"{prefix}.{key}" if prefix else key
            if value is None:
                unset.append(name)
            elif isinstance(value, dict):
                out[key] = present(value, name)
            else:
                out[key] = value
        return out

    import tomli_w

    body = tomli_w.dumps(present(data, ""))
    return (f"# unset: {', '.join(unset)}\n" if unset else "") + body
