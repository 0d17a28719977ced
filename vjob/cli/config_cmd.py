"""`vjob config check FILE | show`: validate a configuration, print the effective one."""

from __future__ import annotations

import argparse
import json
from typing import Any

from vjob import config as vconfig
from vjob.cli import load_config

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
    vconfig.load(args.file)
    print(f"{args.file}: ok")
    return 0


def _reference(args: argparse.Namespace) -> int:
    print(vconfig.reference(), end="")
    return 0


def _show(args: argparse.Namespace) -> int:
    data = vconfig.masked(load_config(args))
    if args.format == "json":
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(_to_toml(data))
    return 0


def _to_toml(data: dict[str, Any], prefix: str = "") -> str:
    """A small TOML writer for the effective configuration (stdlib has only a reader)."""
    scalars, tables, arrays = [], [], []
    for key, value in data.items():
        if isinstance(value, dict):
            tables.append((key, value))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            arrays.append((key, value))
        elif value is None:
            scalars.append(f"# {key} is unset")
        else:
            scalars.append(f"{key} = {_toml_value(value)}")
    out = []
    if scalars:
        if prefix:
            out.append(f"[{prefix}]")
        out.extend(scalars)
        out.append("")
    for key, value in tables:
        out.append(_to_toml(value, f"{prefix}.{key}" if prefix else key))
    for key, items in arrays:
        name = f"{prefix}.{key}" if prefix else key
        for item in items:
            out.append(f"[[{name}]]")
            out.extend(f"{k} = {_toml_value(v)}" for k, v in item.items())
            out.append("")
    return "\n".join(line for line in out if line is not None).rstrip() + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))
